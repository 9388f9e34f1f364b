"""workers/infra/host_metrics.py on a real SQLite database: the host's CPU and held GPUs in
"EagleNest/Hosts" under the service's account "", sampled by the host's first live worker
only; the watchdog samples it at its pace and stops with the worker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from eaglenest.db import metrics_repo, placement_repo
from eaglenest.db.migrate import upgrade_head
from eaglenest.db.session import Database
from eaglenest.foundation.host.children import Identity
from eaglenest.foundation.instance_types import lookup
from eaglenest.foundation.queue import TaskQueue
from eaglenest.foundation.settings import Settings
from eaglenest.workers.infra import reconcile
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.infra.host_metrics import NAMESPACE, HostSampler

HOST = (("Host", "host-a"),)


@pytest.fixture
def ctx(tmp_path: Path):  # type: ignore[no-untyped-def]
    # a declared inventory: placement without GPUs to read (no NVML figure is invented)
    settings = Settings(data_dir=tmp_path, host_name="host-a", gpus="2x24GiB")
    upgrade_head(settings.resolved_database_url())
    c = WorkerContext(settings=settings, db=Database(settings.resolved_database_url()),
                      queue=TaskQueue("redis://127.0.0.1:9/0"), owner="w-1", queues="serve")
    c.placer.register()
    yield c
    c.shutting_down.set()
    c.metrics.close()
    c.db.dispose()


def stats(ctx: WorkerContext, name: str, dims: tuple = HOST) -> list[metrics_repo.Stat]:
    now = time.time()
    with ctx.db.session() as s:
        return metrics_repo.statistics(s, "", NAMESPACE, name, dims, now - 3600, now + 60,
                                       3600)


def test_the_first_worker_of_a_host_samples_it(ctx):
    ctx.placer.take("arn:aws:sagemaker:us-east-1:123456789012:endpoint/e", "v-0",
                    lookup("ml.g5.xlarge"))
    sampler = HostSampler(ctx)
    until = time.process_time() + 0.2
    while time.process_time() < until:  # some CPU to measure
        pass
    data = {d.name: d for d in sampler.sample()}
    assert set(data) == {"CPUUtilization", "GPUsHeld"}  # declared GPUs: no GPU figures
    assert 0 < data["CPUUtilization"].value <= 100
    ctx.metrics.flush()
    [held] = stats(ctx, "GPUsHeld")
    assert (held.sample_count, held.sum, held.unit) == (1, 1.0, "Count")
    [cpu] = stats(ctx, "CPUUtilization")
    assert cpu.unit == "Percent" and cpu.sum == pytest.approx(data["CPUUtilization"].value)
    assert stats(ctx, "GPUUtilization", (*HOST, ("GPU", "0"))) == []

    with ctx.db.session() as s:  # an older worker of the same host samples it, not this one
        placement_repo.register(s, placement_repo.WorkerInfo(
            "a-0", "host-a", Identity.of(1) or Identity(1, 0), "train", ()))
    assert sampler.sample() == []


def test_the_watchdog_samples_the_host_until_the_worker_stops(ctx, monkeypatch):
    monkeypatch.setattr(reconcile, "BROKER_POLL_SECONDS", 0.02)
    thread = reconcile.start_watchdog(ctx, host_metrics_seconds=0.05)
    deadline = time.monotonic() + 20
    while not stats(ctx, "GPUsHeld"):
        assert time.monotonic() < deadline, "the watchdog wrote no host figure"
        ctx.metrics.flush()
        time.sleep(0.05)
    ctx.shutting_down.set()
    thread.join(10)
    assert not thread.is_alive()
    ctx.metrics.flush()
    count = stats(ctx, "GPUsHeld")[0].sample_count
    time.sleep(0.2)
    ctx.metrics.flush()
    assert stats(ctx, "GPUsHeld")[0].sample_count == count  # stopped: nothing more
