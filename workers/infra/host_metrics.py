"""A worker host's figures in the metric store, about once a minute (the watchdog's pace:
workers/infra/reconcile.py `start_watchdog`).

Namespace "EagleNest/Hosts", account id "" (the service's own series: CloudWatch reads,
which are per account, never return them; the operator's /metrics scrape does):
- dimension (Host): CPUUtilization (Percent, the whole host's busy share of all its CPUs
  since the previous sample, 0-100), GPUsHeld (Count, GPUs of this host held by endpoint
  instances and jobs now, db/placement_repo.py);
- dimensions (GPU, Host), GPU = the worker's index: GPUUtilization and GPUMemoryUtilization
  (Percent, NVML; only where workers/infra/metrics.py `Nvml` can read the GPU).
`Host` is the placement host name (EAGLENEST_HOST_NAME). Several worker processes on one
host (a train and a serve worker) write once: only the host's first live worker by owner
(db/placement_repo.py `live_workers`) samples.
"""

from __future__ import annotations

import time

import psutil

from eaglenest.db import placement_repo
from eaglenest.db.metrics_repo import Datum
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.infra.metrics import Nvml, datum

NAMESPACE = "EagleNest/Hosts"
#: the service's own account id: its series are never one account's
SERVICE_ACCOUNT = ""
SAMPLE_SECONDS = 60.0


def _busy_idle() -> tuple[float, float]:
    """CPU seconds of the host so far: (busy, idle); guest time is already in user time."""
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - idle, idle


class HostSampler:
    """One sample of the host per `sample()` (module docstring)."""

    def __init__(self, ctx: WorkerContext, nvml: Nvml | None = None) -> None:
        self.ctx = ctx
        self.nvml = nvml  # built at the first sample
        self._cpu = _busy_idle()  # the first sample's CPU figure is since now

    def first_on_host(self) -> tuple[bool, int]:
        """Whether this worker samples its host, and the GPUs held on the host."""
        host = self.ctx.placer.host
        with self.ctx.db.session() as s:
            live = [w.owner for w in placement_repo.live_workers(s, self.ctx.lease_seconds)
                    if w.host == host]
            held = placement_repo.gpu_totals(s, self.ctx.lease_seconds).get(host, (0, 0))[1]
        return (not live or live[0] == self.ctx.owner), held

    def sample(self, now: float | None = None) -> list[Datum]:
        """Add this host's figures to the store (nothing when another worker of the host
        samples it); the data added."""
        first, held = self.first_on_host()
        cpu, self._cpu = self._cpu, _busy_idle()
        if not first:
            return []
        now = time.time() if now is None else now
        host = {"Host": self.ctx.placer.host}
        data = [datum(NAMESPACE, "GPUsHeld", host, held, "Count", now)]
        busy, idle = self._cpu[0] - cpu[0], self._cpu[1] - cpu[1]
        if busy + idle > 0:
            data.append(datum(NAMESPACE, "CPUUtilization", host,
                              100.0 * busy / (busy + idle), "Percent", now))
        if self.nvml is None:
            self.nvml = Nvml(self.ctx.settings.gpus)
        for gpu in self.ctx.placer.gpus:
            usage = self.nvml.usage(gpu.index)
            if usage is None:
                continue
            dims = {**host, "GPU": str(gpu.index)}
            data.append(datum(NAMESPACE, "GPUUtilization", dims, usage[0], "Percent", now))
            data.append(datum(NAMESPACE, "GPUMemoryUtilization", dims, usage[1], "Percent",
                              now))
        self.ctx.metrics.add(SERVICE_ACCOUNT, data)
        return data
