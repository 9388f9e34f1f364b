"""Quotas per account: endpoints, instances across endpoints and concurrent optimization
jobs beyond the limits are ResourceLimitExceeded, and the refused resource is not created;
an update that would raise the instances past the limit changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.security.conftest import ROLE, container, error_of
from tests.support.jobs import upload
from tests.support.stack import Stack

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
    sm.delete_endpoint(EndpointName="e4")  # a job holds instances too: room for its one GPU
    sm.create_optimization_job(**job("j1"))
    message = refused(sm.create_optimization_job, **job("j2"))
    assert message.startswith("The account-level service limit 'concurrent optimization "
                              "jobs' is 1 Jobs, with current utilization of 1 Jobs")
    with pytest.raises(ClientError, match="does not exist"):
        sm.describe_optimization_job(OptimizationJobName="j2")
    sm.stop_optimization_job(OptimizationJobName="j1")  # no worker owns it: STOPPED at once
    sm.create_optimization_job(**job("j2"))


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[Stack]:
    """A stack with a serve worker, room for 3 instances, and two endpoints of one
    instance each InService (`a`, `b`); configs of 1, 2 and 3 instances."""
    s = Stack(tmp_path_factory.mktemp("update-quotas"), extra_env={
        "EAGLENEST_WORKER_QUEUES": "serve", "EAGLENEST_MAX_INSTANCES": "3"}).start()
    upload(s, tiny_llama_dir, "s3://models/tiny/")
    sm = s.client()
    sm.create_model(ModelName="m", ExecutionRoleArn=ROLE, PrimaryContainer=container())
    for count in (1, 2, 3):
        sm.create_endpoint_config(EndpointConfigName=f"cfg-{count}", ProductionVariants=[{
            "VariantName": "AllTraffic", "ModelName": "m", "InstanceType": "ml.g5.2xlarge",
            "InitialInstanceCount": count, "ContainerStartupHealthCheckTimeoutInSeconds": 120}])
    for name in ("a", "b"):
        sm.create_endpoint(EndpointName=name, EndpointConfigName="cfg-1")
    for name in ("a", "b"):
        sm.get_waiter("endpoint_in_service").wait(
            EndpointName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 240})
    yield s
    s.stop()


def describe(sm: Any, name: str) -> dict[str, Any]:
    d = sm.describe_endpoint(EndpointName=name)
    d.pop("ResponseMetadata")
    return d


def test_updates_past_the_instance_limit_change_nothing(serving: Stack) -> None:
    """UpdateEndpoint and UpdateEndpointWeightsAndCapacities that would run more instances
    than the account may: ResourceLimitExceeded, and the endpoint stays InService on its
    old config, its description unchanged."""
    sm = serving.client()
    before = describe(sm, "a")
    assert before["EndpointStatus"] == "InService"
    message = refused(sm.update_endpoint, EndpointName="a", EndpointConfigName="cfg-3")
    assert message.startswith("The account-level service limit 'instances across all "
                              "endpoints' is 3 Instances, with current utilization of 1 "
                              "Instances and a request delta of 3 Instances.")
    message = refused(sm.update_endpoint_weights_and_capacities, EndpointName="a",
                      DesiredWeightsAndCapacities=[{"VariantName": "AllTraffic",
                                                    "DesiredInstanceCount": 3}])
    assert "current utilization of 1 Instances and a request delta of 3" in message
    assert describe(sm, "a") == before
    assert describe(sm, "a")["EndpointConfigName"] == "cfg-1"


def test_a_pending_update_holds_its_new_fleet(serving: Stack) -> None:
    """While `a` is Updating to 2 instances, those 2 count: `b` may not grow to 2 as well
    (1 + 2 instances of the 3 is all there is). Refused without any change to `b`."""
    sm = serving.client()
    sm.update_endpoint(EndpointName="a", EndpointConfigName="cfg-2")
    before = describe(sm, "b")
    message = refused(sm.update_endpoint, EndpointName="b", EndpointConfigName="cfg-2")
    assert "current utilization of 2 Instances and a request delta of 2" in message
    assert describe(sm, "b") == before
    sm.get_waiter("endpoint_in_service").wait(
        EndpointName="a", WaiterConfig={"Delay": 1, "MaxAttempts": 240})
    assert describe(sm, "a")["EndpointConfigName"] == "cfg-2"
