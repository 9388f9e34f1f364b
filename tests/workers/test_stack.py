"""`eaglenest up` as a whole: real Celery worker, embedded Redis, restart persistence."""

from __future__ import annotations

import time

import pytest
import redis
from botocore.exceptions import ClientError, EndpointConnectionError
from eaglenest_testing import Stack

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"
JOB = {
    "RoleArn": ROLE, "ModelSource": {"S3": {"S3Uri": "s3://bucket/m/"}},
    "DeploymentInstanceType": "ml.g5.2xlarge",
    "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
    "OutputConfig": {"S3OutputLocation": "s3://bucket/out/"},
    "StoppingCondition": {"MaxRuntimeInSeconds": 600},
}


def broker(stack: Stack) -> redis.Redis:
    import json

    port = json.loads((stack.data_dir / "broker.json").read_text())["port"]
    return redis.Redis(host="127.0.0.1", port=port)


def wait_for(pred, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_restart_loses_nothing(tmp_path):
    stack = Stack(tmp_path).start()
    try:
        sm = stack.client()
        sm.create_model(ModelName="keep-me", ExecutionRoleArn=ROLE,
                        PrimaryContainer={"Image": "lmi"})
        sm.create_endpoint_config(EndpointConfigName="cfg", ProductionVariants=[{
            "VariantName": "v", "ModelName": "keep-me", "InstanceType": "ml.g5.2xlarge"}])
        sm.create_endpoint(EndpointName="ep", EndpointConfigName="cfg")
        sm.create_optimization_job(OptimizationJobName="job", **JOB)
        before = (sm.describe_model(ModelName="keep-me"), sm.describe_endpoint(EndpointName="ep"),
                  sm.describe_optimization_job(OptimizationJobName="job"))
    finally:
        stack.stop()
    with pytest.raises(EndpointConnectionError):
        stack.client().list_models()  # the service is really down
    stack.start()
    try:
        sm = stack.client()
        after = (sm.describe_model(ModelName="keep-me"), sm.describe_endpoint(EndpointName="ep"),
                 sm.describe_optimization_job(OptimizationJobName="job"))
        for b, a in zip(before, after, strict=True):
            b.pop("ResponseMetadata")
            a.pop("ResponseMetadata")
            assert a == b
        with pytest.raises(ClientError):
            sm.create_model(ModelName="keep-me", ExecutionRoleArn=ROLE,
                            PrimaryContainer={"Image": "lmi"})
    finally:
        stack.stop()


def test_worker_consumes_tasks_and_reconciles(tmp_path):
    """Tasks reach a real Celery worker through the embedded Redis and leave the queue
    empty; a job accepted while no worker ran is re-enqueued when a worker starts."""
    stack = Stack(tmp_path).start()
    try:
        sm = stack.client()
        r = broker(stack)
        sm.create_optimization_job(OptimizationJobName="queued", **JOB)
        wait_for(lambda: r.llen("train") == 0)
        assert "job queued stays STARTING" in stack.log() or wait_for(
            lambda: "job queued stays STARTING" in stack.log()) is None
        status = sm.describe_optimization_job(OptimizationJobName="queued")
        assert status["OptimizationJobStatus"] == "STARTING"
    finally:
        stack.stop()
    stack.start()
    try:
        wait_for(lambda: stack.log().count("job queued stays STARTING") >= 2)
        assert "reconciled: re-enqueued 1 jobs" in stack.log()
    finally:
        stack.stop()
