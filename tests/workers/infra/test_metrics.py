"""workers/infra/metrics.py on a real SQLite metric store: the worker's ProcessMetrics (one
buffer per process, a forked pool process's own; samplers stopped by close(); nothing added
after it), TreeUsage's CPU and memory of a process tree, and Nvml writing nothing for a
declared GPU inventory."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from eaglenest.db import metrics_repo
from eaglenest.db.migrate import upgrade_head
from eaglenest.db.session import Database
from eaglenest.foundation.host.loops import Loop
from eaglenest.foundation.settings import Settings
from eaglenest.workers.infra.metrics import Nvml, ProcessMetrics, TreeUsage, datum

DIMS = {"Host": "h1"}


@pytest.fixture
def metrics(tmp_path: Path):  # type: ignore[no-untyped-def]
    settings = Settings(data_dir=tmp_path, metrics_flush_seconds=60)
    upgrade_head(settings.resolved_database_url())
    db = Database(settings.resolved_database_url())
    m = ProcessMetrics(settings, db)
    yield m
    m.close()
    db.dispose()


def sums(m: ProcessMetrics, name: str) -> list[tuple[float, float]]:
    now = time.time()
    with m.db.session() as s:
        return [(st.sample_count, st.sum) for st in metrics_repo.statistics(
            s, "", "T", name, (("Host", "h1"),), now - 3600, now + 60, 3600)]


def test_one_buffer_per_process_and_nothing_after_close(metrics):
    metrics.add("", [datum("T", "Parent", DIMS, 1.0, "Count")])  # pending at the fork
    pid = os.fork()
    if pid == 0:  # as a prefork pool process: its own buffer, closed when it ends
        code = 1
        try:
            metrics.db.engine.dispose(close=False)  # as celery_app's on_child_start
            metrics.add("", [datum("T", "Child", DIMS, 2.0, "Count")])
            metrics.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sums(metrics, "Child") == [(1, 2.0)]
    assert sums(metrics, "Parent") == []  # the parent's pending data are the parent's
    metrics.flush()
    assert sums(metrics, "Parent") == [(1, 1.0)]  # once, not once per process

    ticks: list[float] = []
    loop = Loop("test-sampler", lambda: ticks.append(1.0), 0.01)
    metrics.own(loop)
    metrics.start()
    deadline = time.monotonic() + 10
    while not ticks:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    metrics.close()
    assert not loop.thread.is_alive()  # its owner closed: the sampler stopped
    metrics.add("", [datum("T", "Late", DIMS, 1.0, "Count")])
    metrics.flush()
    assert sums(metrics, "Late") == []


def test_tree_usage_is_the_cpu_the_tree_spent():
    usage = TreeUsage()
    me = [os.getpid()]
    first, memory = usage.sample("me", me, time.time())
    assert first is None  # no previous sample
    rss = psutil.Process().memory_info().rss
    assert memory == pytest.approx(100 * rss / psutil.virtual_memory().total, rel=0.2)
    wall, cpu = time.time(), time.process_time()
    while time.process_time() - cpu < 0.3:
        pass
    percent, _ = usage.sample("me", me, time.time())
    spent = time.process_time() - cpu
    assert percent is not None
    assert percent == pytest.approx(100 * spent / (time.time() - wall), rel=0.25, abs=5)
    usage.keep([])  # forgotten: the next sample starts again
    assert usage.sample("me", me)[0] is None


def test_a_declared_inventory_has_no_gpu_figures():
    nvml = Nvml("2x24GiB")
    assert nvml.declared and not nvml.available
    assert nvml.usage(0) is None
