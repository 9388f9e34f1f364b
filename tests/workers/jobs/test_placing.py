"""Placing a job (workers/jobs/placing.py): each attempt at a job holds its GPUs under a
unit of its own, so an attempt that loses the claim frees only what it took."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eaglenest.db import optimization_jobs_repo as jobs
from eaglenest.db import placement_repo
from eaglenest.db.migrate import upgrade_head
from eaglenest.db.session import Database
from eaglenest.foundation.accounts import Account, ResourceRef
from eaglenest.foundation.queue import TaskQueue
from eaglenest.foundation.settings import Settings
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.jobs import placing

ACCOUNT = Account("us-east-1", "123456789012")
ARN = ACCOUNT.arn("optimization-job", "j")


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[WorkerContext]:
    settings = Settings(data_dir=tmp_path, gpus="2x24GiB:A10G", host_name="host-a")
    upgrade_head(settings.resolved_database_url())
    c = WorkerContext(settings=settings, db=Database(settings.resolved_database_url()),
                      queue=TaskQueue("redis://127.0.0.1:9/0"), owner="me:1")
    c.placer.register()
    with c.db.session() as s:
        jobs.create(s, ACCOUNT, {
            "OptimizationJobName": "j", "RoleArn": "arn:aws:iam::123456789012:role/R",
            "ModelSource": {"S3": {"S3Uri": "s3://models/tiny/"}},
            "DeploymentInstanceType": "ml.g5.2xlarge",
            "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
            "OutputConfig": {"S3OutputLocation": "s3://output/jobs/"},
            "StoppingCondition": {"MaxRuntimeInSeconds": 600}})
    yield c
    c.db.dispose()


def held(ctx: WorkerContext) -> list[tuple[int, str]]:
    with ctx.db.session() as s:
        return [(h.gpu_index, h.unit) for h in placement_repo.holdings(s) if h.holder == ARN]


def test_an_attempt_that_loses_the_claim_frees_only_its_own_gpus(ctx: WorkerContext) -> None:
    ref = ResourceRef.parse(ARN)
    assert ref is not None
    first = placing.place(ctx, ref)
    second = placing.place(ctx, ref)  # a duplicate delivery, before the first claims
    assert isinstance(first, placing.Placement) and isinstance(second, placing.Placement)
    assert first.unit != second.unit and first.unit.startswith("job@host-a/")
    assert sorted(first.gpus + second.gpus) == [0, 1]  # never one GPU twice
    with ctx.db.session() as s:
        assert jobs.claim(s, ARN, ctx.owner) is not None  # the first attempt runs it
    placing.release(ctx, ref, second)  # the second lost the claim
    assert held(ctx) == [(first.gpus[0], first.unit)]
    placing.release(ctx, ref, first)
    assert held(ctx) == []


def test_a_duplicate_that_finds_no_gpu_steps_aside_once_the_job_is_placed(
        ctx: WorkerContext) -> None:
    ref = ResourceRef.parse(ARN)
    assert ref is not None
    first = placing.place(ctx, ref)
    assert isinstance(first, placing.Placement) and first.gpus == [0]
    with ctx.db.session() as s:  # the host's other GPU serves an endpoint
        assert placement_repo.take(s, ctx.placer.info(), ACCOUNT.arn("endpoint", "e"),
                                   "AllTraffic-0", 1, 24) == [1]
    # the job is still STARTING: without the check it would wait for capacity (routed)
    assert placing.place(ctx, ref) == "not-claimed"
    assert held(ctx) == [(0, first.unit)]
