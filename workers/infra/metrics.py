"""A worker process's link to the metric store (db/metric_buffer.py, db/metrics_repo.py),
and what both rooms measure with: a process tree's CPU and memory (psutil), a GPU's
utilization and memory (NVML).

Contract:
- `ProcessMetrics` (one per worker, `WorkerContext.metrics`) holds one MetricBuffer per
  process: `add()` builds and starts it on first use in the calling process. A prefork pool
  process gets a buffer of its own: the parent's flusher thread does not survive a fork, and
  what the parent had pending is the parent's to write. `add()` never blocks on the database
  and never raises (a datum that cannot be kept is dropped and counted by the buffer).
- It owns the worker's samplers (`own()`: objects with `start()` and `stop()`, e.g.
  workers/serving/endpoint_metrics.py `EndpointSampler`): `start()` starts them (the worker
  is ready), `close()` stops them, then flushes and closes the buffer. The worker's lifetime
  owns it: workers/infra/celery_app.py starts it when the worker is ready and closes it at
  shutdown, and closes a pool process's buffer when that process ends. Samplers belong to
  the process that started them; `close()` in a forked pool process touches only its buffer.
- `TreeUsage` turns two samples of a process tree into CPU percent (CloudWatch's
  CPUUtilization of an instance: 100 per busy core, so up to 100 x cores) and memory percent
  (resident memory of the tree over the host's total).
- `Nvml` reads a GPU's utilization and memory where the nvidia-ml-py package (`pynvml`) is
  importable, NVML initialises, and the worker's GPUs are real ones: a declared inventory
  (EAGLENEST_GPUS=4x24GiB, foundation/host/gpus.py) has no device to read, so nothing is
  written for it (no invented figure).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import psutil

from eaglenest.db.metric_buffer import MetricBuffer
from eaglenest.db.metrics_repo import Datum
from eaglenest.db.session import Database
from eaglenest.foundation.host.gpus import visible_devices
from eaglenest.foundation.settings import Settings

log = logging.getLogger("eaglenest.metrics")
#: EAGLENEST_GPUS naming a declared inventory (foundation/host/gpus.py `inventory`)
_DECLARED = re.compile(r"^\d+x", re.I)


def datum(namespace: str, name: str, dimensions: Mapping[str, str], value: float, unit: str,
          at: float | None = None) -> Datum:
    """A Datum with its dimensions sorted by name (the store's key); `at`: now."""
    return Datum(namespace, name, tuple(sorted(dimensions.items())), float(value), unit,
                 time.time() if at is None else at)


class Sampler(Protocol):
    def start(self) -> object: ...

    def stop(self, timeout: float | None = None) -> None: ...


class ProcessMetrics:
    """The worker's MetricBuffer (one per process) and samplers: module contract."""

    def __init__(self, settings: Settings, db: Database) -> None:
        self.settings, self.db = settings, db
        self._lock = threading.Lock()
        self._buffer: MetricBuffer | None = None
        self._buffer_pid = 0
        self._owner_pid = os.getpid()
        self._samplers: list[Sampler] = []
        self._started = False
        self._closed_pid = 0  # the process whose buffer was closed: it adds nothing more
        # a fork while another thread holds the lock must not leave the child waiting on it
        os.register_at_fork(after_in_child=functools.partial(_new_lock, weakref.ref(self)))

    def buffer(self) -> MetricBuffer:
        """This process's buffer, built and started on first use; RuntimeError once closed."""
        with self._lock:
            if self._closed_pid == os.getpid():
                raise RuntimeError("the worker's metric buffer is closed")
            if self._buffer is None or self._buffer_pid != os.getpid():
                self._buffer = MetricBuffer(
                    self.db, self.settings.metrics_max_series_per_account,
                    self.settings.metrics_flush_seconds,
                    retention_seconds=self.settings.metrics_retention_days * 86400.0)
                self._buffer.start()
                self._buffer_pid = os.getpid()
            return self._buffer

    def add(self, account_id: str, data: Iterable[Datum]) -> None:
        """Queue `data` of `account_id` ("" for the service's own series); after `close()`
        in this process, nothing."""
        if self._closed_pid == os.getpid():
            return
        try:
            buffer = self.buffer()
            for d in data:
                buffer.add(account_id, d)
        except Exception as exc:  # figures are never worth a job or an endpoint task
            log.warning("metric data of account %r dropped: %s", account_id, exc)

    def flush(self) -> None:
        """Write what this process has pending now (a job's last figures before it ends)."""
        with self._lock:
            buffer = self._buffer if self._buffer_pid == os.getpid() else None
        if buffer is not None:
            try:
                buffer.flush()
            except Exception as exc:
                log.warning("metric data not written: %s", exc)

    def own(self, sampler: Sampler) -> None:
        """Own `sampler`: started by `start()` (at once if started already), stopped by
        `close()`."""
        with self._lock:
            self._samplers.append(sampler)
            started = self._started
        if started:
            sampler.start()

    def start(self) -> None:
        with self._lock:
            self._started, samplers = True, list(self._samplers)
        for sampler in samplers:
            sampler.start()

    def close(self) -> None:
        """Stop the samplers (in the process that owns them), then flush and close this
        process's buffer."""
        if os.getpid() == self._owner_pid:
            with self._lock:
                samplers, self._samplers, self._started = self._samplers, [], False
            for sampler in samplers:
                sampler.stop(timeout=10)
        with self._lock:
            buffer = self._buffer if self._buffer_pid == os.getpid() else None
            self._buffer, self._closed_pid = None, os.getpid()
        if buffer is not None:
            try:
                buffer.close()
            except Exception as exc:
                log.warning("metric data not written at shutdown: %s", exc)


def _new_lock(ref: weakref.ref[ProcessMetrics]) -> None:
    metrics = ref()
    if metrics is not None:
        metrics._lock = threading.Lock()


class TreeUsage:
    """CPU and memory of process trees between samples, by a key per tree (module contract).
    A process seen for the first time counts whole when it started after the previous
    sample, else from now on; one that ended between samples drops out."""

    def __init__(self) -> None:
        #: key -> (time of the sample, CPU seconds by (pid, create time))
        self._last: dict[str, tuple[float, dict[tuple[int, float], float]]] = {}

    def sample(self, key: str, pids: Iterable[int],
               now: float | None = None) -> tuple[float | None, float]:
        """(CPU percent since the key's previous sample, None on its first; memory percent)."""
        now = time.time() if now is None else now
        times, rss = _tree_times(pids)
        before = self._last.get(key)
        self._last[key] = (now, times)
        memory = 100.0 * rss / psutil.virtual_memory().total
        if before is None or now <= before[0]:
            return None, memory
        then, old = before
        spent = 0.0
        for (pid, created), seconds in times.items():
            if (pid, created) in old:
                spent += max(0.0, seconds - old[(pid, created)])
            elif created >= then:
                spent += seconds
        return 100.0 * spent / (now - then), memory

    def keep(self, keys: Iterable[str]) -> None:
        """Forget the trees not in `keys` (stopped instances)."""
        wanted = set(keys)
        for key in [k for k in self._last if k not in wanted]:
            del self._last[key]


def _tree_times(pids: Iterable[int]) -> tuple[dict[tuple[int, float], float], int]:
    times: dict[tuple[int, float], float] = {}
    rss = 0
    for pid in set(pids):
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                cpu = proc.cpu_times()
                times[(pid, proc.create_time())] = cpu.user + cpu.system
                rss += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return times, rss


class Nvml:
    """GPU utilization and memory by the worker's GPU index (module contract). The worker's
    index i is NVML's device i, unless the worker runs under CUDA_VISIBLE_DEVICES: then its
    i-th entry (a physical index, or a GPU UUID or a unique prefix of one)."""

    def __init__(self, gpus_spec: str | None) -> None:
        self.declared = bool(_DECLARED.match((gpus_spec or "").replace(" ", "")))
        self._nvml: Any = None
        self._tried = False
        self._lock = threading.Lock()

    def _library(self) -> Any:
        with self._lock:
            if not self._tried:
                self._tried = True
                if not self.declared:
                    self._nvml = _init_nvml()
            return self._nvml

    @property
    def available(self) -> bool:
        return self._library() is not None

    def usage(self, index: int) -> tuple[float, float] | None:
        """(utilization percent, memory used percent) of the worker's GPU `index`; None
        where NVML cannot tell."""
        nvml = self._library()
        if nvml is None:
            return None
        try:
            handle = self._handle(nvml, visible_devices([index]))
            if handle is None:
                return None
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            return float(rates.gpu), 100.0 * float(memory.used) / max(float(memory.total), 1.0)
        except Exception as exc:  # pynvml.NVMLError and its kin: this GPU, this time
            log.debug("NVML could not read GPU %d: %s", index, exc)
            return None

    @staticmethod
    def _handle(nvml: Any, entry: str) -> Any:
        if entry.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(entry))
        want = entry.lower()
        found = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            if uuid.lower().startswith(want):
                found.append(handle)
        return found[0] if len(found) == 1 else None

    def close(self) -> None:
        with self._lock:
            nvml, self._nvml = self._nvml, None
        if nvml is not None:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()


def _init_nvml() -> Any:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver: NVML is not there to read
        log.info("NVML not available (%s): no GPU utilization is recorded", exc)
        return None
    return pynvml
