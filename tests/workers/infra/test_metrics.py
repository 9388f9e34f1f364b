"""workers/infra/metrics.py on a real SQLite metric store: the worker's ProcessMetrics (one
buffer per process, a forked pool process's own; samplers stopped by close(); nothing added
after it), TreeUsage's CPU and memory of a process tree, Nvml's mapping of the worker's GPU
index to NVML's device, and nothing read for a declared GPU inventory."""

from __future__ import annotations

import os
import sys
import time
import types
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


class _Device:
    def __init__(self, uuid: str, gpu: int, used: int) -> None:
        self.uuid, self.gpu, self.used = uuid, gpu, used


def _nvml_library(devices: list[_Device]) -> types.ModuleType:
    """NVML's Python API (pynvml) answering for `devices`: this host has no GPU, so the
    mapping from the worker's GPU index to NVML's device is checked against it; the figures
    of a real GPU are not verified here."""
    lib = types.ModuleType("pynvml")
    lib.nvmlInit = lambda: None  # type: ignore[attr-defined]
    lib.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    lib.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    lib.nvmlDeviceGetHandleByIndex = lambda i: devices[i]  # type: ignore[attr-defined]
    lib.nvmlDeviceGetUUID = lambda d: d.uuid.encode()  # type: ignore[attr-defined]
    lib.nvmlDeviceGetUtilizationRates = (  # type: ignore[attr-defined]
        lambda d: types.SimpleNamespace(gpu=d.gpu, memory=0))
    lib.nvmlDeviceGetMemoryInfo = (  # type: ignore[attr-defined]
        lambda d: types.SimpleNamespace(used=d.used, total=1000, free=1000 - d.used))
    return lib


def test_the_workers_gpu_index_is_read_from_its_own_nvml_device(monkeypatch):
    devices = [_Device("GPU-aaaa-1111", 10, 100), _Device("GPU-bbbb-2222", 40, 250)]
    monkeypatch.setitem(sys.modules, "pynvml", _nvml_library(devices))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert Nvml(None).usage(1) == (40.0, 25.0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")  # the worker's 0 is physical 1
    assert Nvml("").usage(0) == (40.0, 25.0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa")  # a unique UUID prefix
    assert Nvml("0").usage(0) == (10.0, 10.0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-")  # names both: no figure
    assert Nvml(None).usage(0) is None
    assert Nvml("2x80GiB").usage(0) is None  # declared: never read
