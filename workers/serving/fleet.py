"""Starting an endpoint's fleet (the variants of one config) for a transition, on this host
or, when no single host can place a variant's instances but the hosts together can, over
several hosts (workers/serving/spread.py); and a host's part of stopping them.

Contract:
- `launch(ctx, ep, config, overrides, status)` returns the fleet's deployment record once
  every instance serves. When another host is to start the rest, it records what it started
  (db/endpoint_spread.PLACING, the transition in `status` owned by this worker) and raises
  WaitingForCapacity naming that host: the task goes there once the lease is released, and
  that host's `launch` goes on from the record. On any failure every instance started so
  far, on any host, is stopped (capacity.stop) and the record dropped.
- `retire(ctx, ep)`: the retire task's body, on the host it was sent to: stop this host's
  instances the endpoint's RETIRING lists, free their GPUs, and, for a Deleting endpoint
  that no host has anything left of, send the delete again (it removes the row).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path
from typing import Any

from eaglenest.db import endpoint_retention, endpoint_spread
from eaglenest.db import endpoints_repo as eps
from eaglenest.db.repository import locate
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation.accounts import ResourceRef
from eaglenest.foundation.deployment import instances_of
from eaglenest.foundation.host.threads import compute_budget
from eaglenest.foundation.queue import ENDPOINT_DELETE_TASK, SERVE_QUEUE
from eaglenest.foundation.store.buckets import AccountStore
from eaglenest.foundation.store.storage import make_store
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.infra.placement import NoCapacity
from eaglenest.workers.serving import capacity, spread
from eaglenest.workers.serving.deploy import DeployError, VariantPlan, plan_variants, start_variant
from eaglenest.workers.serving.records import deployment

log = logging.getLogger("eaglenest.endpoints")


def work_dir(ctx: WorkerContext, ep: ResourceRef) -> Path:
    """The endpoint's files on this host (model copies, server logs)."""
    return ctx.settings.data_dir / "endpoints" / ep.local_key


def overrides(ctx: WorkerContext, ep: ResourceRef,
              new_config: bool = False) -> dict[str, dict[str, Any]]:
    """The endpoint's weights and counts that replace its config's (a pending change
    included), or with `new_config` those retained for a pending UpdateEndpoint's."""
    with ctx.db.session() as s:
        row = locate(s, EndpointRow, ep.arn)
        if row is None:
            return {}
        if new_config:
            return dict(row.spec.get(endpoint_retention.PENDING_OVERRIDES) or {})
        return eps.effective_overrides(row.spec)


def plans(ctx: WorkerContext, ep: ResourceRef, config_name: str,
          changes: dict[str, dict[str, Any]] | None = None) -> list[VariantPlan]:
    """The variants of `config_name` with the weights and counts of `changes`."""
    with ctx.db.session() as s:
        out = plan_variants(s, ep.account_id, config_name)
    cap = ctx.settings.max_instances_per_variant
    for plan in out:
        o = (changes or {}).get(plan.variant, {})
        plan.weight = float(o.get("DesiredWeight", plan.weight))
        plan.instance_count = int(o.get("DesiredInstanceCount", plan.instance_count))
    for plan in out:  # the config may predate a lower cap on this worker
        plan.vllm_module, plan.kernel_cache = ctx.settings.vllm_module, ctx.kernels_dir
        plan.compute_budget = compute_budget(ctx.settings.max_compute_processes)
        if plan.instance_count > cap:
            raise DeployError(f"Variant {plan.variant} asks for {plan.instance_count} "
                              f"instances; this worker allows at most {cap} "
                              "(EAGLENEST_MAX_INSTANCES_PER_VARIANT).")
    return out


def launch(ctx: WorkerContext, ep: ResourceRef, config_name: str,
           changes: dict[str, dict[str, Any]] | None = None, status: str = ""
           ) -> dict[str, Any]:
    """Start every variant of `config_name` (weights and counts from `changes` where it
    has them), going on from what other hosts started for the transition in `status`
    (none: this host alone); module docstring."""
    fleet = plans(ctx, ep, config_name, changes)
    servers = _placed(ctx, ep) if status else {}
    then: str | None = None
    try:
        for plan in fleet:
            then = _start_here(ctx, ep, plan, servers, bool(status)) or then
        if then is not None:
            _save(ctx, ep, status, servers)
    except NoCapacity as exc:
        _abandon(ctx, ep, status, servers)
        raise capacity.capacity(ctx, ep, exc) from exc
    except BaseException:
        _abandon(ctx, ep, status, servers)
        raise
    if then is not None:
        raise capacity.WaitingForCapacity(None, then)
    return deployment(fleet, servers)


def _start_here(ctx: WorkerContext, ep: ResourceRef, plan: VariantPlan,
                servers: dict[str, Any], may_spread: bool) -> str | None:
    """Start this host's share of the variant's instances not started yet (into
    `servers`); the host that is to start the rest, if any."""
    before = servers.get(plan.variant)
    remaining = plan.instance_count - (len(instances_of(before)) if before else 0)
    if remaining <= 0:
        return None
    part = spread.share(ctx, plan, remaining) if may_spread else spread.Share(remaining)
    if part.here:
        store = AccountStore(make_store(ctx.settings), plan.account_id)
        record = start_variant(  # the model and head as the config's account may read them
            store, work_dir(ctx, ep), ep.name,
            dataclasses.replace(plan, instance_count=part.here),
            ctx.settings.advertise_host, ctx.children_dir,
            resource=f"endpoint:{ep.local_key}", placement=capacity.placement(ctx, ep))
        servers[plan.variant] = spread.merge(before, record)
    return part.then


def _placed(ctx: WorkerContext, ep: ResourceRef) -> dict[str, Any]:
    with ctx.db.session() as s:
        row = locate(s, EndpointRow, ep.arn)
        return endpoint_spread.placing(row.deployment) if row is not None else {}


def _save(ctx: WorkerContext, ep: ResourceRef, status: str, servers: dict[str, Any]) -> None:
    with ctx.db.session() as s:
        ok = endpoint_spread.save_placing(s, ep.arn, ctx.owner, status, servers)
    if not ok:
        raise capacity.Superseded(f"The endpoint is no longer {status}.")


def _abandon(ctx: WorkerContext, ep: ResourceRef, status: str, servers: dict[str, Any]
             ) -> None:
    """Stop every instance started for the transition, on any host, and forget them."""
    try:
        capacity.stop(ctx, ep, servers)
    finally:
        if status:
            with ctx.db.session() as s:
                endpoint_spread.save_placing(s, ep.arn, ctx.owner, status, {})


def retire(ctx: WorkerContext, ep: ResourceRef) -> str:
    """The retire task on this host (module docstring)."""
    host = ctx.placer.host
    with ctx.db.session() as s:
        instances = endpoint_spread.retiring(s, ep.arn, host)
    spread.stop_here(ctx, ep, {"retiring": {"instances": instances}})
    units = [str(i["unit"]) for i in instances if i.get("unit")]
    with ctx.db.session() as s:
        status, left = endpoint_spread.retired(s, ep.arn, host, units)
    if status == eps.DELETING:
        shutil.rmtree(work_dir(ctx, ep), ignore_errors=True)
        if not left:  # the delete task removes the row now
            ctx.queue.send(ENDPOINT_DELETE_TASK, ep.arn, SERVE_QUEUE)
    log.info("endpoint %s: stopped %d instance(s) on host %s", ep.name, len(instances), host)
    return f"retired {len(instances)}"
