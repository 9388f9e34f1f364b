"""The instances of one variant over several hosts.

Contract:
- `share(ctx, plan, remaining)`: how many of a variant's instances not yet started this
  host starts now, and to which host the transition is handed next. One host is preferred:
  this one when it can place them all, else another that can (the task is handed there
  before anything starts here). Only when no single host can, but the hosts together can,
  are they spread: this host starts what it can place and the next host (the one with the
  most room) the rest. When even together they cannot, it raises `Nowhere` (a NoCapacity:
  the transition waits for capacity on its queue, then fails).
- Each instance is started, and stopped, by a worker of the host that holds its GPUs: its
  record names that `host` (and `url`, at the host's EAGLENEST_ADVERTISE_HOST).
  `stop_here` stops this host's instances and frees their GPUs; `retire_remote` records
  another host's in the endpoint's RETIRING (db/endpoint_spread.py) and sends that host's
  worker the retire task on its own queue (``serve.<host>``, as capacity routing does); a
  host without a live worker has nothing left running (its children died with it): only
  its GPUs are freed.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eaglenest.db import endpoint_spread, placement_repo
from eaglenest.db.endpoints_repo import SHIFT
from eaglenest.foundation.accounts import ResourceRef
from eaglenest.foundation.deployment import instances_of
from eaglenest.foundation.instance_types import UnsupportedInstanceType, lookup
from eaglenest.foundation.queue import ENDPOINT_RETIRE_TASK, SERVE_QUEUE
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.infra.placement import NoCapacity, host_queue
from eaglenest.workers.serving.records import stop_servers, units_of

if TYPE_CHECKING:
    from eaglenest.workers.serving.deploy import VariantPlan

log = logging.getLogger("eaglenest.endpoints")


class Nowhere(NoCapacity):
    """Not even the live hosts together can place the variant's instances now: the task
    waits on its queue (capacity.hand_on) rather than going from host to host."""


@dataclass(frozen=True)
class Share:
    """A variant's instances this host starts now, and the host the transition goes to
    next for the rest (None: none is left for another host)."""

    here: int
    then: str | None = None


def share(ctx: WorkerContext, plan: VariantPlan, remaining: int) -> Share:
    """Where the variant's `remaining` instances go (module docstring)."""
    try:
        itype = lookup(plan.instance_type) if plan.instance_type else None
    except UnsupportedInstanceType:
        itype = None  # deploy.py reports it
    if itype is None or itype.accelerators == 0:
        return Share(remaining)
    with ctx.db.session() as s:
        if not placement_repo.any_gpus(s, ctx.settings.job_lease_seconds):
            return Share(remaining)  # GPU types run on CPUs: any host takes them all
        slots = placement_repo.free_slots(s, SERVE_QUEUE, itype.accelerators,
                                          itype.memory_gib, ctx.settings.job_lease_seconds)
    here = slots.pop(ctx.placer.host, 0)
    if here >= remaining:
        return Share(remaining)
    if here + sum(slots.values()) < remaining:
        raise Nowhere(itype, f"{remaining} instance(s) of {itype.accelerators} GPU(s) needed; "
                             f"the free GPUs of the live hosts hold {here + sum(slots.values())}")
    packs = [h for h, n in slots.items() if n >= remaining]
    if packs:  # another host holds them all: the tightest fit, nothing started here
        return Share(0, min(packs, key=lambda h: (slots[h], h)))
    return Share(here, max(slots, key=lambda h: (slots[h], h)))


def local(ctx: WorkerContext, instance: dict[str, Any]) -> bool:
    """Whether the instance runs on this worker's host (one without a recorded host was
    started before placement recorded hosts: by this host's workers)."""
    return instance.get("host") in (None, ctx.placer.host)


def split(ctx: WorkerContext, servers: dict[str, Any]
          ) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """These variant records' instances on this host (as records) and, by host, elsewhere."""
    here: dict[str, Any] = {}
    away: dict[str, list[dict[str, Any]]] = {}
    for variant, record in servers.items():
        mine = []
        for inst in instances_of(record):
            if local(ctx, inst):
                mine.append(inst)
            else:
                away.setdefault(str(inst["host"]), []).append(inst)
        if len(mine) == len(instances_of(record)):
            here[variant] = record  # all of this host's, as it stands
        elif mine:
            here[variant] = {"instances": mine}
    return here, away


def stop_here(ctx: WorkerContext, ep: ResourceRef, servers: dict[str, Any]) -> None:
    """Stop these instances of this host and free the GPUs they held."""
    try:
        stop_servers(servers, ctx.children_dir)
    finally:
        units = units_of(servers)
        if units:
            ctx.placer.release(ep.arn, units)


def retire_remote(ctx: WorkerContext, ep: ResourceRef,
                  away: dict[str, list[dict[str, Any]]]) -> None:
    """Have each host's worker stop its instances of these (module docstring)."""
    if not away:
        return
    with ctx.db.session() as s:
        live = placement_repo.live_hosts(s, SERVE_QUEUE, ctx.settings.job_lease_seconds)
        gone = [h for h in away if h not in live]
        dead_units = [str(i["unit"]) for h in gone for i in away[h] if i.get("unit")]
        if dead_units:
            placement_repo.release(s, ep.arn, dead_units, hosts=gone)
        recorded = endpoint_spread.retire(s, ep.arn, {h: v for h, v in away.items()
                                                      if h in live})
    if not recorded:
        log.warning("endpoint %s is gone; its instances on %s were not recorded to stop",
                    ep.name, ", ".join(sorted(away)))
    send_retire(ctx, ep, [h for h in away if h in live])


def send_retire(ctx: WorkerContext, ep: ResourceRef, hosts: list[str]) -> None:
    for host in sorted(set(hosts)):
        ctx.queue.send(ENDPOINT_RETIRE_TASK, ep.arn, host_queue(SERVE_QUEUE, host))
        log.info("endpoint %s: host %s is to stop its instances", ep.name, host)


def merge(before: dict[str, Any] | None, record: dict[str, Any]) -> dict[str, Any]:
    """A variant's record with the instances another host started first (`before`) and
    those of `record`, started here; each instance names its own model files (`dir`)."""
    if before is None:
        return record
    return {**before, "instances": instances_of(before) + instances_of(record)}


def every_server(deployment: dict[str, Any]) -> dict[str, Any]:
    """Every instance a deployment record lists (serving, shifted to, being placed), as
    variant records under distinct keys: what DeleteEndpoint stops."""
    out: dict[str, Any] = {}
    parts = {"": deployment.get("Servers") or {},
             "shift:": (deployment.get(SHIFT) or {}).get("Servers") or {},
             "placing:": endpoint_spread.placing(deployment)}
    for prefix, servers in parts.items():
        for variant, record in servers.items():
            out[prefix + variant] = record
    return out


def live_dead_hosts(ctx: WorkerContext, servers: dict[str, Any], dead: dict[str, list[int]]
                    ) -> tuple[dict[str, list[int]], list[str], bool]:
    """Of a recovery's dead instances: those of this host (by variant), the other hosts
    whose live worker is to restart theirs, and whether some ran on a host with no live
    worker (they cannot be restarted where their model files are)."""
    here: dict[str, list[int]] = {}
    away: set[str] = set()
    for variant, idx in dead.items():
        insts = instances_of(servers[variant])
        mine = [i for i in idx if local(ctx, insts[i])]
        if mine:
            here[variant] = mine
        away |= {str(insts[i]["host"]) for i in idx if not local(ctx, insts[i])}
    if not away:
        return here, [], False
    with ctx.db.session() as s:
        live = placement_repo.live_hosts(s, SERVE_QUEUE, ctx.settings.job_lease_seconds)
    return here, sorted(away & live), bool(away - live)


def retire_pending(ctx: WorkerContext, ep: ResourceRef, sent: Collection[str] = ()) -> None:
    """The hosts the endpoint's RETIRING still names: one without a live worker is forgotten
    (its GPUs freed), the others are sent the retire task (again, unless in `sent`)."""
    with ctx.db.session() as s:
        live = placement_repo.live_hosts(s, SERVE_QUEUE, ctx.settings.job_lease_seconds)
        gone = endpoint_spread.forget_hosts(s, ep.arn, live)
        units = [str(i["unit"]) for i in gone if i.get("unit")]
        if units:
            placement_repo.release(s, ep.arn, units)
        hosts = endpoint_spread.retiring_hosts(s, ep.arn)
    send_retire(ctx, ep, [h for h in hosts if h not in sent])
