"""Outages of the production path's services while the stack runs (issue #7).

(a) Postgres stops (`pg_ctl stop -m fast`): every call answers an AWS-shaped error
    (503 ServiceUnavailable, which botocore would retry; the client here makes one attempt
    so we see it) and never a 500 or a traceback. After Postgres is back the same client
    works again and everything created before the outage is still there.
(b) Redis stops: CreateOptimizationJob still succeeds - the job lives in the database and
    the failed publish is only logged - and once Redis is back the running worker's
    watchdog re-sends STARTING jobs older than a lease (the queue being empty), so the job
    runs: it fails, as it must, because its model does not exist, which proves a worker
    took it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.stack import ACCOUNT, REGION, Stack, wait_for

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"
LEAKS = ("Traceback", 'File "', "psycopg", "sqlalchemy", "OperationalError")


@pytest.fixture(scope="module")
def outage_stack(tmp_path_factory, postgres_server, redis_server):  # type: ignore[no-untyped-def]
    # A database of its own: the other integration modules share the cluster.
    url = postgres_server.create_database("outages")
    s = Stack(tmp_path_factory.mktemp("outages"), extra_env={
        "EAGLENEST_DATABASE_URL": url, "EAGLENEST_BROKER_URL": redis_server.url,
        "EAGLENEST_JOB_LEASE_SECONDS": "5"})
    s.start()
    yield s
    s.stop()


def _error(call: Callable[[], Any]) -> tuple[int, str, str]:
    """(HTTP status, AWS error code, message) of a call that must fail."""
    with pytest.raises(ClientError) as info:
        call()
    response = info.value.response
    return (response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"],
            response["Error"]["Message"])


def _job(sm: Any, name: str, uri: str) -> None:
    sm.create_optimization_job(
        OptimizationJobName=name, RoleArn=ROLE, ModelSource={"S3": {"S3Uri": uri}},
        DeploymentInstanceType="ml.g5.2xlarge",
        OptimizationConfigs=[{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
        OutputConfig={"S3OutputLocation": "s3://b/o/"},
        StoppingCondition={"MaxRuntimeInSeconds": 60})


def test_postgres_outage_answers_aws_errors_and_recovers(outage_stack: Stack,
                                                         postgres_server: Any) -> None:
    sm = outage_stack.client()  # total_max_attempts=1: we see the 503, not botocore's retries
    sm.create_model(ModelName="outage-before", ExecutionRoleArn=ROLE,
                    PrimaryContainer={"Image": "x"})
    sm.create_endpoint_config(EndpointConfigName="outage-before", ProductionVariants=[{
        "VariantName": "v", "ModelName": "outage-before", "InstanceType": "ml.m5.large"}])
    log_before = len(outage_stack.log())

    postgres_server.stop()
    try:
        calls = {
            "DescribeModel": lambda: sm.describe_model(ModelName="outage-before"),
            "ListModels": lambda: sm.list_models(),
            "CreateModel": lambda: sm.create_model(
                ModelName="outage-during", ExecutionRoleArn=ROLE,
                PrimaryContainer={"Image": "x"}),
            "DeleteEndpointConfig": lambda: sm.delete_endpoint_config(
                EndpointConfigName="outage-before"),
            "ListOptimizationJobs": lambda: sm.list_optimization_jobs(),
        }
        for op, call in calls.items():
            status, code, message = _error(call)
            assert (status, code) == (503, "ServiceUnavailable"), (op, status, code, message)
            assert message and not any(leak in message for leak in LEAKS), (op, message)
    finally:
        postgres_server.start()
    outage_log = outage_stack.log()[log_before:]
    assert "database unavailable during" in outage_log
    assert "unhandled error" not in outage_log  # the API's catch-all (500) never ran

    # The same client (and the API's same connection pool) works again at once.
    assert sm.describe_model(ModelName="outage-before")["ModelName"] == "outage-before"
    config = sm.describe_endpoint_config(EndpointConfigName="outage-before")
    assert config["ProductionVariants"][0]["ModelName"] == "outage-before"
    names = [m["ModelName"] for m in sm.list_models(NameContains="outage-")["Models"]]
    assert names == ["outage-before"]  # nothing lost, and the rejected create left nothing
    sm.create_model(ModelName="outage-after", ExecutionRoleArn=ROLE,
                    PrimaryContainer={"Image": "x"})
    assert sm.describe_model(ModelName="outage-after")["ModelName"] == "outage-after"


def test_redis_outage_keeps_the_job_and_the_running_worker_runs_it(outage_stack: Stack,
                                                              redis_server: Any) -> None:
    sm = outage_stack.client()
    redis_server.stop()
    try:
        start = time.monotonic()
        _job(sm, "outage-job", "s3://bucket/outage-model/")
        publish_seconds = time.monotonic() - start
        job = sm.describe_optimization_job(OptimizationJobName="outage-job")
        assert job["OptimizationJobStatus"] == "STARTING"
        arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:optimization-job/outage-job"
        wait_for(lambda: f"could not publish eaglenest.optimize({arn})" in outage_stack.log(),
                  10, "the failed publish was not logged", outage_stack)
    finally:
        redis_server.start()
    assert publish_seconds < 15  # the API gives up on the broker quickly (retries, timeouts)

    # Redis came back empty: the task was never queued. The running worker's watchdog
    # re-sends STARTING jobs older than a lease once the queue is empty; no restart needed.

    def finished() -> bool:
        job = sm.describe_optimization_job(OptimizationJobName="outage-job")
        return job["OptimizationJobStatus"] in ("COMPLETED", "FAILED", "STOPPED")

    wait_for(finished, 60, "the job was never picked up", outage_stack)
    job = sm.describe_optimization_job(OptimizationJobName="outage-job")
    assert job["OptimizationJobStatus"] == "FAILED"
    assert job["FailureReason"] == "nothing found at s3://bucket/outage-model/"
