"""A worker's side of GPU placement (db/placement_repo.py holds the facts).

Contract:
- The worker registers its host name, its GPUs (foundation/host/gpus.py inventory of
  EAGLENEST_GPUS) and its queues when it is ready, heartbeats every third of a lease, and
  unregisters at a clean shutdown.
- `take(holder, unit, instance_type, backend=)` places one endpoint instance or one job on
  this worker's host: whole GPUs, as many as the type has, each big enough; [] for a CPU
  type. A GPU type on a worker without GPUs runs on its CPU only while no live worker
  anywhere has a GPU (a laptop, CI); otherwise NoCapacity, and so when this host's GPUs are
  taken. A CPU type served by vLLM is NoCapacity on a worker with GPUs (its vLLM is the
  CUDA build, which sees the GPUs through NVML whatever CUDA_VISIBLE_DEVICES says and fails
  without one): it needs a host without GPUs, or the embedded engine (pure torch, which
  runs on the CPU anywhere). backend "" (unknown, jobs) places a CPU type anywhere.
- `route(task, arn, queue, instance_type)` hands a task this host could not place to a
  host that can now (its own queue ``<queue>.<host>``; for a CPU type, a host without
  GPUs), else back to `queue` after a short delay: Celery's queue carries the work, no loop
  of ours waits. The caller decides, by its deadline (EAGLENEST_CAPACITY_WAIT_SECONDS),
  whether to route again or fail with `capacity_reason()`.
"""

from __future__ import annotations

import logging
import os
import threading

from eaglenest.db import placement_repo as repo
from eaglenest.db.session import Database
from eaglenest.foundation.host.children import Identity
from eaglenest.foundation.host.gpus import Gpu, inventory, visible_devices
from eaglenest.foundation.instance_types import InstanceType
from eaglenest.foundation.queue import TaskQueue
from eaglenest.foundation.settings import Settings

log = logging.getLogger("eaglenest.placement")
#: the server backend whose build on a host with GPUs is the CUDA one (serving's "vllm")
VLLM = "vllm"
#: seconds before a task no host could place is offered to the queue again
RETRY_SECONDS = 3.0


def host_queue(queue: str, host: str) -> str:
    """The queue only `host`'s workers consume, beside `queue`."""
    return f"{queue}.{host}"


def capacity_reason(instance_type: str, why: str) -> str:
    """A FailureReason in SageMaker's words for missing capacity."""
    return ("Unable to provision requested ML compute capacity due to "
            f"InsufficientInstanceCapacity error for {instance_type} ({why}). Please retry "
            "using a different ML instance type or after some time.")


class NoCapacity(Exception):
    """This host cannot place the instance type now; the message says why."""

    def __init__(self, instance_type: InstanceType, why: str) -> None:
        super().__init__(why)
        self.instance_type, self.why = instance_type, why


class Placer:
    """GPU placement for one worker process (its identity is the process that built it)."""

    def __init__(self, settings: Settings, db: Database, owner: str, queues: str = "") -> None:
        self.settings, self.db, self.owner = settings, db, owner
        self.queues = queues
        self._gpus: list[Gpu] | None = None
        self._identity = Identity.of(os.getpid()) or Identity(os.getpid(), 0)
        self._lock = threading.Lock()

    @property
    def host(self) -> str:
        return self.settings.host_name

    @property
    def gpus(self) -> list[Gpu]:
        """This worker's GPUs (detected once, on first use)."""
        with self._lock:
            if self._gpus is None:
                self._gpus = inventory(self.settings.gpus)
            return self._gpus

    def info(self) -> repo.WorkerInfo:
        return repo.WorkerInfo(self.owner, self.host, self._identity, self.queues,
                               tuple(self.gpus))

    def register(self) -> None:
        with self.db.session() as s:
            repo.register(s, self.info())
        log.info("worker %s on host %s: %s", self.owner, self.host, self.describe())

    def describe(self) -> str:
        if not self.gpus:
            return "no GPUs (CPU serving and training)"
        return f"{len(self.gpus)} GPU(s): " + ", ".join(
            f"{g.index} {g.name} {g.memory_gib:g} GiB" for g in self.gpus)

    def heartbeat(self) -> None:
        with self.db.session() as s:
            alive = repo.heartbeat(s, self.owner)
        if not alive:  # reclaimed while silent: it holds nothing now; be placeable again
            log.warning("worker %s was presumed dead; registering again", self.owner)
            self.register()

    def unregister(self) -> None:
        with self.db.session() as s:
            repo.unregister(s, self.owner)

    def take(self, holder: str, unit: str, itype: InstanceType, *, backend: str = ""
             ) -> list[int]:
        """GPU indexes now held by (holder, unit); [] when it runs on the CPU. `backend`:
        the server's ("vllm", "embedded"; "": not known yet). Module contract."""
        if itype.accelerators == 0:
            self._check_cpu(itype, backend)
            return []
        with self.db.session() as s:
            kept = repo.held(s, holder, self.host).get(unit)
            if kept:  # a restarted instance keeps the GPUs its unit holds
                return kept
            if not self.gpus:
                if repo.any_gpus(s, self.settings.job_lease_seconds):
                    raise NoCapacity(itype, f"host {self.host} has no GPUs")
                return []  # no GPU anywhere: GPU types run on the CPU
            got = repo.take(s, self.info(), holder, unit, itype.accelerators,
                            itype.memory_gib)
        if got is None:
            raise NoCapacity(itype, self._shortage(itype))
        log.info("%s %s holds GPUs %s of host %s (%s)", holder, unit, got, self.host,
                 itype.name)
        return got

    def _check_cpu(self, itype: InstanceType, backend: str) -> None:
        """NoCapacity when a CPU type's server cannot run on this host: vLLM beside GPUs."""
        if backend == VLLM and self.gpus:
            raise NoCapacity(itype, f"host {self.host} has GPUs and its vLLM is a CUDA build: "
                                    "a CPU instance type needs a host without GPUs or "
                                    "EAGLENEST_SERVING_BACKEND=embedded")

    def _shortage(self, itype: InstanceType) -> str:
        fit = [g for g in self.gpus if g.fits(itype.memory_gib)]
        if len(fit) < itype.accelerators:
            return (f"it needs {itype.accelerators} x {itype.accelerator} "
                    f"{itype.memory_gib:g} GiB; host {self.host} has {len(fit)} such GPU(s)")
        return (f"{itype.accelerators} free GPU(s) needed; the GPUs of host {self.host} "
                "are held by other endpoints and jobs")

    def holds(self, holder: str) -> bool:
        """Whether the holder holds GPUs on any host now."""
        with self.db.session() as s:
            return bool(repo.held(s, holder))

    def release(self, holder: str, units: list[str] | None = None) -> None:
        """Free what the holder holds (only `units`, when given), on any host."""
        with self.db.session() as s:
            freed = repo.release(s, holder, units)
        if freed:
            log.info("%s released %d GPU(s)", holder, freed)

    def route(self, queue: TaskQueue, task: str, arn: str, base_queue: str,
              itype: InstanceType) -> str:
        """Send the task to a host that can place `itype` now (a CPU type: a host without
        GPUs, the only kind take() refuses it on), else to `base_queue` again after
        RETRY_SECONDS; the queue it went to."""
        with self.db.session() as s:
            free, _ = repo.hosts_that_fit(s, base_queue, itype.accelerators, itype.memory_gib,
                                          self.settings.job_lease_seconds,
                                          without_gpus=itype.accelerators == 0)
        others = [h for h in free if h != self.host]
        target = host_queue(base_queue, others[0]) if others else base_queue
        queue.send(task, arn, target, countdown=0 if others else RETRY_SECONDS)
        return target

    def visible(self, indexes: list[int]) -> dict[str, str]:
        """The environment entry that shows a child its GPUs; a child of a host with GPUs
        that holds none sees none. Empty on a host without GPUs (nothing to hide)."""
        if not indexes and not self.gpus:
            return {}
        return {"CUDA_VISIBLE_DEVICES": visible_devices(indexes)}
