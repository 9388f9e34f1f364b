"""The same control plane on real Postgres (EAGLENEST_DATABASE_URL) and a real Redis
broker (EAGLENEST_BROKER_URL): round trips, concurrency, restart persistence."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from botocore.exceptions import ClientError

from tests.support.stack import Stack

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"


@pytest.fixture(scope="module")
def pg_stack(tmp_path_factory, postgres_url, redis_url):
    s = Stack(tmp_path_factory.mktemp("pg"), extra_env={
        "EAGLENEST_DATABASE_URL": postgres_url, "EAGLENEST_BROKER_URL": redis_url})
    s.start()
    yield s
    s.stop()


def test_runs_on_postgres_not_sqlite(pg_stack):
    sm = pg_stack.client()
    sm.create_model(ModelName="pg-model", ExecutionRoleArn=ROLE, PrimaryContainer={"Image": "x"})
    assert sm.describe_model(ModelName="pg-model")["ModelName"] == "pg-model"
    assert not (pg_stack.data_dir / "eaglenest.db").exists()
    assert not (pg_stack.data_dir / "broker.json").exists()  # the external Redis is used


def test_tasks_go_through_real_redis(pg_stack, redis_url):
    sm = pg_stack.client()
    sm.create_optimization_job(
        OptimizationJobName="pg-job", RoleArn=ROLE,
        ModelSource={"S3": {"S3Uri": "s3://bucket/m/"}}, DeploymentInstanceType="ml.g5.2xlarge",
        OptimizationConfigs=[{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
        OutputConfig={"S3OutputLocation": "s3://b/o/"},
        StoppingCondition={"MaxRuntimeInSeconds": 60})
    import time

    r = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 60
    while sm.describe_optimization_job(
            OptimizationJobName="pg-job")["OptimizationJobStatus"] != "FAILED":
        assert time.monotonic() < deadline, pg_stack.log()[-2000:]
        time.sleep(0.2)
    reason = sm.describe_optimization_job(OptimizationJobName="pg-job")["FailureReason"]
    assert reason == "nothing found at s3://bucket/m/"
    assert r.llen("train") == 0


def test_concurrent_creates_with_duplicate_names(pg_stack):
    """200 CreateModel calls over 50 names from 8 threads: exactly 50 models, no 5xx."""
    clients = [pg_stack.client() for _ in range(8)]

    def create(i: int) -> str:
        try:
            clients[i % 8].create_model(ModelName=f"race-{i % 50}", ExecutionRoleArn=ROLE,
                                        PrimaryContainer={"Image": "x"})
            return "ok"
        except ClientError as e:
            assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 400
            return e.response["Error"]["Code"]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(create, range(200)))
    assert results.count("ok") == 50
    assert set(results) == {"ok", "ValidationException"}
    pages = clients[0].get_paginator("list_models").paginate(NameContains="race-")
    assert len([m for p in pages for m in p["Models"]]) == 50


def test_restart_keeps_state(pg_stack):
    sm = pg_stack.client()
    sm.create_model(ModelName="survivor", ExecutionRoleArn=ROLE, PrimaryContainer={"Image": "x"})
    pg_stack.stop()
    pg_stack.start()
    assert pg_stack.client().describe_model(ModelName="survivor")["ModelName"] == "survivor"
