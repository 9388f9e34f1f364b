"""Quotas per account: endpoints, instances across endpoints and concurrent optimization
jobs beyond the limits are ResourceLimitExceeded, and the refused resource is not created."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from benchmarks.stack import Stack
from tests.security.conftest import ROLE, container, error_of

LIMITS = {"EAGLENEST_MAX_ENDPOINTS": "3", "EAGLENEST_MAX_INSTANCES": "3",
          "EAGLENEST_MAX_CONCURRENT_OPTIMIZATION_JOBS": "1"}


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # API and broker only: endpoints stay Creating and jobs STARTING, holding their quota
    s = Stack(tmp_path_factory.mktemp("quotas"),
              extra_env={"EAGLENEST_WORKER_QUEUES": "", **LIMITS}).start()
    sm = s.client()
    sm.create_model(ModelName="m", ExecutionRoleArn=ROLE, PrimaryContainer=container())
    for variants, count in ((1, 1), (1, 2), (2, 2), (10, 4)):
        sm.create_endpoint_config(
            EndpointConfigName=f"cfg-{variants}x{count}", ProductionVariants=[{
                "VariantName": f"v{i}", "ModelName": "m", "InstanceType": "ml.g5.2xlarge",
                "InitialInstanceCount": count} for i in range(variants)])
    yield s
    s.stop()


def refused(call: Any, **kw: Any) -> str:
    with pytest.raises(ClientError) as exc:
        call(**kw)
    code, message = error_of(exc)
    assert code == "ResourceLimitExceeded"
    return message


def test_instances_and_endpoints(limited: Stack) -> None:
    sm = limited.client()
    # the 10 variants x 4 instances: 40 model servers
    message = refused(sm.create_endpoint, EndpointName="big", EndpointConfigName="cfg-10x4")
    assert message.startswith("The account-level service limit 'instances across all "
                              "endpoints' is 3 Instances, with current utilization of 0 "
                              "Instances and a request delta of 40 Instances.")
    assert "EAGLENEST_MAX_INSTANCES" in message
    names = [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]]
    assert "big" not in names
    sm.create_endpoint(EndpointName="e1", EndpointConfigName="cfg-1x1")
    sm.create_endpoint(EndpointName="e2", EndpointConfigName="cfg-1x2")
    message = refused(sm.create_endpoint, EndpointName="e3", EndpointConfigName="cfg-1x1")
    assert "current utilization of 3 Instances and a request delta of 1" in message
    sm.delete_endpoint(EndpointName="e2")  # never deployed: gone at once
    sm.create_endpoint(EndpointName="e3", EndpointConfigName="cfg-1x1")
    sm.create_endpoint(EndpointName="e4", EndpointConfigName="cfg-1x1")
    message = refused(sm.create_endpoint, EndpointName="e5", EndpointConfigName="cfg-1x1")
    assert message.startswith("The account-level service limit 'endpoints' is 3 Endpoints, "
                              "with current utilization of 3 Endpoints")
    assert sorted(e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]) == \
        ["e1", "e3", "e4"]


def job(name: str) -> dict[str, Any]:
    return {"OptimizationJobName": name, "RoleArn": ROLE,
            "ModelSource": {"S3": {"S3Uri": "s3://models/tiny/"}},
            "DeploymentInstanceType": "ml.g5.2xlarge",
            "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
            "OutputConfig": {"S3OutputLocation": "s3://output/quota/"},
            "StoppingCondition": {"MaxRuntimeInSeconds": 60}}


def test_concurrent_optimization_jobs(limited: Stack) -> None:
    sm = limited.client()
    sm.create_optimization_job(**job("j1"))
    message = refused(sm.create_optimization_job, **job("j2"))
    assert message.startswith("The account-level service limit 'concurrent optimization "
                              "jobs' is 1 Jobs, with current utilization of 1 Jobs")
    with pytest.raises(ClientError, match="does not exist"):
        sm.describe_optimization_job(OptimizationJobName="j2")
    sm.stop_optimization_job(OptimizationJobName="j1")  # no worker owns it: STOPPED at once
    sm.create_optimization_job(**job("j2"))
