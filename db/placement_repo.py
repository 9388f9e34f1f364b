"""GPU placement, as database facts: which workers run on which host with which GPUs, and
which endpoint instance or job holds each GPU.

Contract:
- A worker `register`s its host name, identity, queues and GPUs at start and heartbeats;
  `unregister` at a clean shutdown drops it and what it held (its children are stopped).
- `take` gives a holder (an ARN) and one of its units (an endpoint instance, or a job)
  whole GPUs of the taking worker's host, all or none: one gpu_holdings row per GPU, unique
  per (host, GPU), inserted in one savepoint, so two concurrent placements never get the
  same GPU (the loser's insert fails and it takes nothing).
- `release` frees a holder's GPUs (some units, or all) when its processes stop.
- `reclaim` frees what a dead worker held: on the machine that checks, one whose process
  (pid and start time, since this boot) is gone, at once; on another machine, one whose
  heartbeat is older than the lease. A live local worker is never presumed dead.
- `release_orphans` frees holdings whose holder no longer exists or has ended (a deleted
  endpoint, a finished job), unless a transition may still be placing it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from eaglenest.db.repository import now
from eaglenest.db.tables import EndpointRow, GpuHoldingRow, OptimizationJobRow, WorkerRow
from eaglenest.foundation.host.children import BOOT, HOST, Identity
from eaglenest.foundation.host.gpus import Gpu

#: job statuses whose GPUs stay held (the job runs, or is being placed / handed back)
_JOB_HOLDS = ("STARTING", "INPROGRESS", "STOPPING")


@dataclass(frozen=True)
class WorkerInfo:
    owner: str
    host: str
    identity: Identity
    queues: str
    gpus: tuple[Gpu, ...]


def register(session: Session, info: WorkerInfo) -> None:
    t = now()
    row = session.get(WorkerRow, info.owner)
    if row is None:
        row = WorkerRow(owner=info.owner, started_time=t)
        session.add(row)
    row.host, row.queues, row.heartbeat_time = info.host, info.queues, t
    ident = info.identity
    row.machine, row.boot, row.pid, row.pid_start = ident.host, ident.boot, ident.pid, ident.start
    row.gpus = [g.to_dict() for g in info.gpus]


def heartbeat(session: Session, owner: str) -> bool:
    """False when the worker's row is gone (reclaimed as dead): it registers again."""
    row = session.get(WorkerRow, owner)
    if row is None:
        return False
    row.heartbeat_time = now()
    return True


def unregister(session: Session, owner: str) -> None:
    session.execute(delete(GpuHoldingRow).where(GpuHoldingRow.owner == owner))
    session.execute(delete(WorkerRow).where(WorkerRow.owner == owner))


#: how often a take that lost a race for a GPU reads the free GPUs again
TAKE_ATTEMPTS = 8


def take(session: Session, worker: WorkerInfo, holder: str, unit: str, count: int,
         memory_gib: float) -> list[int] | None:
    """`count` free GPUs of the worker's host that fit `memory_gib`, now held by
    (holder, unit) for the worker; None (nothing taken) when there are not enough."""
    if count <= 0:
        return []
    for _ in range(TAKE_ATTEMPTS):
        taken = set(session.scalars(select(GpuHoldingRow.gpu_index)
                                    .where(GpuHoldingRow.host == worker.host)))
        free = [g.index for g in worker.gpus if g.index not in taken and g.fits(memory_gib)]
        if len(free) < count:
            return None
        chosen, t = sorted(free)[:count], now()
        try:
            with session.begin_nested():
                session.add_all([GpuHoldingRow(host=worker.host, gpu_index=i, holder=holder,
                                               unit=unit, owner=worker.owner, since=t)
                                 for i in chosen])
                session.flush()
        except IntegrityError:  # another placement took one of them first: look again
            continue
        return chosen
    return None


def release(session: Session, holder: str, units: Iterable[str] | None = None,
            hosts: Iterable[str] | None = None) -> int:
    """Free the holder's GPUs (only those of `units`, and on `hosts`, when given); how many
    were freed."""
    stmt = delete(GpuHoldingRow).where(GpuHoldingRow.holder == holder)
    if units is not None:
        stmt = stmt.where(GpuHoldingRow.unit.in_(list(units)))
    if hosts is not None:
        stmt = stmt.where(GpuHoldingRow.host.in_(list(hosts)))
    return int(session.execute(stmt).rowcount)  # type: ignore[attr-defined]


def held(session: Session, holder: str, host: str | None = None) -> dict[str, list[int]]:
    """Unit -> GPU indexes the holder holds now (on `host` only, when given)."""
    out: dict[str, list[int]] = {}
    stmt = select(GpuHoldingRow).where(GpuHoldingRow.holder == holder)
    if host is not None:
        stmt = stmt.where(GpuHoldingRow.host == host)
    for row in session.scalars(stmt.order_by(GpuHoldingRow.gpu_index)):
        out.setdefault(row.unit, []).append(row.gpu_index)
    return out


def _dead(row: WorkerRow, cutoff: float) -> bool:
    """On the machine that checks: another boot, or its process is gone (a live process is
    never presumed dead, however late its heartbeat). Elsewhere: silent for a lease."""
    if row.machine == HOST:
        return row.boot != BOOT or not Identity(row.pid, row.pid_start, row.machine,
                                                row.boot).alive()
    return row.heartbeat_time < cutoff


def reclaim(session: Session, lease_seconds: float) -> list[str]:
    """Drop dead workers and free every GPU they held; their owner strings."""
    cutoff = now() - lease_seconds
    dead = [w.owner for w in session.scalars(select(WorkerRow).with_for_update())
            if _dead(w, cutoff)]
    owners = set(session.scalars(select(WorkerRow.owner)))
    orphaned = {o for o in session.scalars(select(GpuHoldingRow.owner).distinct())
                if o not in owners}
    for owner in [*dead, *sorted(orphaned)]:
        unregister(session, owner)
    return [*dead, *sorted(orphaned)]


def release_orphans(session: Session, grace_seconds: float) -> list[str]:
    """Free holdings whose endpoint is gone, or whose job is gone or ended; the holders.
    Holdings younger than `grace_seconds` are left (their placement may be in flight)."""
    cutoff = now() - grace_seconds
    holders = set(session.scalars(select(GpuHoldingRow.holder)
                                  .where(GpuHoldingRow.since < cutoff).distinct()))
    if not holders:
        return []
    endpoints = set(session.scalars(select(EndpointRow.arn)
                                    .where(EndpointRow.arn.in_(holders))))
    jobs = set(session.scalars(select(OptimizationJobRow.arn).where(
        OptimizationJobRow.arn.in_(holders), OptimizationJobRow.status.in_(_JOB_HOLDS))))
    gone = sorted(holders - endpoints - jobs)
    for holder in gone:
        session.execute(delete(GpuHoldingRow).where(GpuHoldingRow.holder == holder,
                                                    GpuHoldingRow.since < cutoff))
    return gone


def live_workers(session: Session, lease_seconds: float) -> list[WorkerRow]:
    cutoff = now() - lease_seconds
    return list(session.scalars(select(WorkerRow).where(WorkerRow.heartbeat_time >= cutoff)
                                .order_by(WorkerRow.host, WorkerRow.owner)))


def holdings(session: Session) -> list[GpuHoldingRow]:
    return list(session.scalars(select(GpuHoldingRow)
                                .order_by(GpuHoldingRow.host, GpuHoldingRow.gpu_index)))


def hosts_that_fit(session: Session, queue: str, count: int, memory_gib: float,
                   lease_seconds: float, without_gpus: bool = False
                   ) -> tuple[list[str], list[str]]:
    """Host names of live workers consuming `queue`: those with `count` free GPUs that fit
    `memory_gib` now, and those that have that many such GPUs at all (free or not).
    `without_gpus`: only hosts none of whose live workers consuming `queue` has a GPU (a
    CPU instance type whose server cannot run beside GPUs)."""
    taken: dict[str, set[int]] = {}
    for host, index in session.execute(select(GpuHoldingRow.host, GpuHoldingRow.gpu_index)):
        taken.setdefault(host, set()).add(index)
    consumers = [w for w in live_workers(session, lease_seconds)
                 if queue in w.queues.split(",")]
    with_gpus = {w.host for w in consumers if w.gpus} if without_gpus else set()
    free_now: list[str] = []
    ever: list[str] = []
    for w in consumers:
        if w.host in with_gpus:
            continue
        fit = [g for g in map(Gpu.from_dict, w.gpus) if g.fits(memory_gib)]
        if len(fit) >= count and w.host not in ever:
            ever.append(w.host)
        free = [g for g in fit if g.index not in taken.get(w.host, set())]
        if len(free) >= count and w.host not in free_now:
            free_now.append(w.host)
    return free_now, ever


def free_slots(session: Session, queue: str, count: int, memory_gib: float,
               lease_seconds: float) -> dict[str, int]:
    """Host -> how many instances of `count` GPUs that fit `memory_gib` its free GPUs hold
    now, for every host whose live workers consume `queue` (0: none)."""
    taken: dict[str, set[int]] = {}
    for host, index in session.execute(select(GpuHoldingRow.host, GpuHoldingRow.gpu_index)):
        taken.setdefault(host, set()).add(index)
    free: dict[str, set[int]] = {}
    for w in live_workers(session, lease_seconds):
        if queue in w.queues.split(","):
            free.setdefault(w.host, set()).update(
                g.index for g in map(Gpu.from_dict, w.gpus)
                if g.fits(memory_gib) and g.index not in taken.get(w.host, set()))
    return {h: len(gpus) // max(count, 1) for h, gpus in free.items()}


def live_hosts(session: Session, queue: str, lease_seconds: float) -> set[str]:
    """Hosts with a live worker that consumes `queue`."""
    return {w.host for w in live_workers(session, lease_seconds)
            if queue in w.queues.split(",")}


def any_gpus(session: Session, lease_seconds: float) -> bool:
    """Whether any live worker has a GPU (else GPU instance types are served on CPUs)."""
    return any(w.gpus for w in live_workers(session, lease_seconds))


def gpu_totals(session: Session, lease_seconds: float) -> dict[str, tuple[int, int]]:
    """Host -> (GPUs its live workers have, GPUs held on it)."""
    gpus: dict[str, set[int]] = {}
    for w in live_workers(session, lease_seconds):
        gpus.setdefault(w.host, set()).update(int(g["index"]) for g in w.gpus)
    held: dict[str, int] = {}
    for host, _ in session.execute(select(GpuHoldingRow.host, GpuHoldingRow.gpu_index)):
        held[host] = held.get(host, 0) + 1
    return {h: (len(gpus.get(h, ())), held.get(h, 0)) for h in sorted(set(gpus) | set(held))}
