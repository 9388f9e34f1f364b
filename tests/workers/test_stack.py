"""`eaglenest up` as a whole: real Celery worker, embedded Redis, restart persistence."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from botocore.exceptions import ClientError, EndpointConnectionError

from tests.support.stack import Stack

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"
JOB = {
    "RoleArn": ROLE, "ModelSource": {"S3": {"S3Uri": "s3://bucket/m/"}},
    "DeploymentInstanceType": "ml.g5.2xlarge",
    "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
    "OutputConfig": {"S3OutputLocation": "s3://bucket/out/"},
    "StoppingCondition": {"MaxRuntimeInSeconds": 600},
}


def broker(stack: Stack) -> redis.Redis:
    from eaglenest.workers.infra.broker import embedded_url

    url = embedded_url(stack.data_dir)
    assert url is not None
    return redis.Redis.from_url(url)


def wait_for(pred, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_restart_loses_nothing(tmp_path):
    # API + broker only: no worker changes states between the two snapshots.
    stack = Stack(tmp_path, extra_env={"EAGLENEST_WORKER_QUEUES": ""}).start()
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


def test_reconcile_runs_jobs_accepted_while_no_worker_ran(tmp_path):
    """A job accepted while no worker ran waits in Redis; when a worker starts, its
    reconciliation re-enqueues it and the real pipeline runs it to a terminal state (here
    FAILED: its model does not exist, and the reason says so)."""
    stack = Stack(tmp_path, extra_env={"EAGLENEST_WORKER_QUEUES": ""}).start()
    try:
        sm = stack.client()
        sm.create_optimization_job(OptimizationJobName="queued", **JOB)
        assert broker(stack).llen("train") == 1
        assert sm.describe_optimization_job(
            OptimizationJobName="queued")["OptimizationJobStatus"] == "STARTING"
    finally:
        stack.stop()
    stack.extra_env = {}
    stack.start()
    try:
        sm = stack.client()
        wait_for(lambda: sm.describe_optimization_job(
            OptimizationJobName="queued")["OptimizationJobStatus"] == "FAILED", timeout=60)
        d = sm.describe_optimization_job(OptimizationJobName="queued")
        assert d["FailureReason"] == "nothing found at s3://bucket/m/"
        assert d["OptimizationStartTime"] <= d["OptimizationEndTime"]
        assert "reconciled: re-enqueued 1 jobs" in stack.log()
        assert broker(stack).llen("train") == 0
        status = subprocess.run(
            [sys.executable, "-m", "eaglenest.cli", "status"], env=stack.env(),
            capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
        assert status.returncode == 0, status.stderr
        assert "jobs: FAILED 1" in status.stdout
        assert "queues: train 0 waiting, serve 0 waiting" in status.stdout
        assert "workers: eaglenest-" in status.stdout
    finally:
        stack.stop()
