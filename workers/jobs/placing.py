"""Placing an optimization job on this worker's host: the GPUs of its DeploymentInstanceType.

A job is placed before it is claimed (it stays STARTING until a host holds its GPUs): the
GPUs are held by the job's ARN on this host, for training, the benchmark stage and nothing
else, until the task ends. Each task's attempt holds them under a unit of its own
(``job@<host>/<attempt>``): a duplicate delivery of the job's task (a re-enqueue by the
reconciler while the first is still placing) takes GPUs of its own or none, loses the claim,
and frees only what it took, never the GPUs of the attempt that runs the job. A host that
cannot place it hands the task on (workers/infra/placement.py route) until
EAGLENEST_CAPACITY_WAIT_SECONDS after the job became STARTING; then the job fails with
SageMaker's insufficient-capacity reason.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field

from eaglenest.db import optimization_jobs_repo as jobs
from eaglenest.db.repository import locate
from eaglenest.db.tables import OptimizationJobRow
from eaglenest.foundation.accounts import ResourceRef
from eaglenest.foundation.host.gpus import MEMORY_TOLERANCE
from eaglenest.foundation.instance_types import UnsupportedInstanceType, lookup
from eaglenest.foundation.memory_plan import GIB, Gpus
from eaglenest.foundation.queue import OPTIMIZE_TASK, TRAIN_QUEUE
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.infra.placement import NoCapacity, capacity_reason
from eaglenest.workers.jobs.options import OptionError
from eaglenest.workers.model_servers.process import cuda_available

log = logging.getLogger("eaglenest.optimize")


@dataclass(frozen=True)
class Placement:
    """What one attempt at a job holds: its GPU indexes ([]: the CPU) under its unit."""

    gpus: list[int]
    unit: str


@dataclass(frozen=True)
class JobGpus:
    """The GPUs a placed job holds: the worker's indexes, the environment entry that shows
    them to its processes (CUDA_VISIBLE_DEVICES), and their type's memory each."""

    indexes: list[int] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    memory_gib: float = 0.0
    #: their CUDA compute capability (None: unknown or the CPU)
    capability: float | None = None

    def held(self) -> Gpus:
        """These GPUs as a memory plan sees them (foundation/memory_plan.gpus_of_type)."""
        return Gpus(len(self.indexes), int(self.memory_gib * MEMORY_TOLERANCE * GIB),
                    self.capability, f"the job's {len(self.indexes)} GPU(s) of "
                    f"{self.memory_gib:g} GiB")

    def device(self, wanted: str | None, ranks: bool = False) -> str:
        """The torch device of the job's stages in the worker's process: ``cpu`` when
        EAGLENEST_DEVICE says so or the job holds no GPU, else the job's first GPU
        (``cuda:<its index>``; ``cuda`` in torchrun ranks, which see only the job's GPUs).
        EAGLENEST_DEVICE=cuda names these GPUs, never the worker's first (GPU 0 may be
        another job's); OptionError when the job holds none."""
        if wanted == "cpu":
            return "cpu"
        if not (self.indexes and cuda_available()):  # none held, or declared without CUDA
            if wanted == "cuda":
                raise OptionError("EAGLENEST_DEVICE=cuda, but the job holds no GPU on this "
                                  "host: its DeploymentInstanceType runs on the CPU here")
            return "cpu"
        return "cuda" if ranks else f"cuda:{self.indexes[0]}"


def place(ctx: WorkerContext, ref: ResourceRef) -> Placement | str:
    """The GPUs this host now holds for this attempt at the job ([]: it trains on the CPU),
    or the task's outcome when it does not run here (not STARTING, handed on, or failed for
    capacity)."""
    with ctx.db.session() as s:
        row = locate(s, OptimizationJobRow, ref.arn)
        if row is None or row.status != jobs.STARTING:
            return "not-claimed"
        type_name = str(row.spec.get("DeploymentInstanceType") or "")
        since = row.last_modified_time
    try:
        itype = lookup(type_name)
    except UnsupportedInstanceType as exc:  # stored before the type was refused at Create
        return _fail_unplaced(ctx, ref, f"DeploymentInstanceType: {exc}")
    unit = f"job@{ctx.placer.host}/{uuid.uuid4().hex[:8]}"
    try:
        return Placement(ctx.placer.take(ref.arn, unit, itype), unit)
    except NoCapacity as exc:
        if ctx.placer.holds(ref.arn):  # another attempt placed it: that one runs the job
            return "not-claimed"
        if time.time() - since < ctx.settings.capacity_wait_seconds:
            where = ctx.placer.route(ctx.queue, OPTIMIZE_TASK, ref.arn, TRAIN_QUEUE, itype)
            log.info("job %s waits for capacity (%s); task sent to %s", ref.name, exc, where)
            return f"waiting for capacity ({where})"
        return _fail_unplaced(ctx, ref, capacity_reason(type_name, exc.why))


def release(ctx: WorkerContext, ref: ResourceRef, placement: Placement) -> None:
    ctx.placer.release(ref.arn, [placement.unit])


def _fail_unplaced(ctx: WorkerContext, ref: ResourceRef, reason: str) -> str:
    """Fail a STARTING job this worker could not place (claimed first: one worker ends it)."""
    log.warning("job %s FAILED: %s", ref.name, reason)
    with ctx.db.session() as s:
        if jobs.claim(s, ref.arn, ctx.owner) is None:
            return "not-claimed"
    with ctx.db.session() as s:
        jobs.fail(s, ref.arn, ctx.owner, reason)
    return jobs.FAILED
