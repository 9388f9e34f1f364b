"""Endpoint lifecycle tasks, by endpoint ARN (queue `serve`).

create: start InitialInstanceCount serving processes per production variant; InService when
every /health answers, else Failed with the reason (bad model files, process exited, health
timeout). update: start the new config's processes beside the old ones, shift traffic to them
when healthy (at once, or in the blue/green steps of its DeploymentConfig), then stop the
old ones; on failure stop the new ones and keep serving the old
(rollback). delete: stop the processes, remove the row. recover: check every instance of an
InService endpoint; restart only the ones that no longer answer (the others keep serving,
status SystemUpdating meanwhile), all of them when none answers (after a restart), or mark
it Failed.

A variant whose instances no single host can place, but the hosts together can, is placed
over several (workers/serving/fleet.py, spread.py): the transition goes from host to host,
each host's worker starting the instances that hold its GPUs, and ends on the last. Every
instance is stopped by a worker of its own host: another host's are handed to it (retire:
`serve.<host>`), a dead one is restarted by its host's worker, and a Deleting endpoint's
row goes once every host has stopped its instances.

Every task holds its transition with an EndpointLease (one worker at a time; a dead one's
task is sent again). Any exception ends the transition: Failed with the reason (create,
delete, recover) or a rollback to the config that serves (update); never left transitional.
Serving processes are owned children of the worker (foundation/host/children.py): they die with it,
and its next start restarts InService endpoints.

A task's argument is the endpoint's ARN: every row it reads (the endpoint, its configs, their
models) is of that ARN's account, and its files are under `endpoints/<account>/<name>/`, so
two accounts' endpoints of one name run side by side. A bare name (queued before names were
per account) is taken only while one account has an endpoint of that name.
"""

from __future__ import annotations

import functools
import logging
import shutil
import threading
from collections.abc import Callable
from typing import Any

from celery import Celery

from eaglenest.db import endpoint_spread, placement_repo
from eaglenest.db import endpoints_repo as eps
from eaglenest.db.repository import resolve
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation.accounts import ResourceRef
from eaglenest.foundation.deployment import instances_of
from eaglenest.foundation.host.ceilings import LimitError
from eaglenest.foundation.queue import (
    ENDPOINT_CREATE_TASK,
    ENDPOINT_DELETE_TASK,
    ENDPOINT_RECOVER_TASK,
    ENDPOINT_RETIRE_TASK,
    ENDPOINT_UPDATE_TASK,
)
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.infra.placement import NoCapacity
from eaglenest.workers.model_servers.process import ServingError
from eaglenest.workers.serving import capacity, fleet, shift, spread
from eaglenest.workers.serving.deploy import (
    DeployError,
    VariantPlan,
    add_instances,
    restart_instances,
)
from eaglenest.workers.serving.endpoint_lease import EndpointLease
from eaglenest.workers.serving.records import (
    dead_instances,
    deployment,
    read_state,
)

log = logging.getLogger("eaglenest.endpoints")


def _by_arn(run: Callable[[WorkerContext, ResourceRef], str]
            ) -> Callable[[WorkerContext, str], str]:
    """A task body called with what the task was sent (db/repository.resolve): the endpoint's
    ARN, or a bare name that one endpoint alone has; anything else is logged and skipped."""
    @functools.wraps(run)
    def task(ctx: WorkerContext, ref: str) -> str:
        with ctx.db.session() as s:
            ep = resolve(s, EndpointRow, ref)
        if ep is None:
            log.warning("endpoint task %s(%s): no single endpoint has this ARN or name; "
                        "skipped", run.__name__, ref)
            return "skipped (no such endpoint)"
        return run(ctx, ep)
    return task


def _reason(ep: ResourceRef, exc: Exception) -> str:
    """A failed task's FailureReason: the message of a deploy/serving error as it stands,
    anything else as an internal error (logged with its traceback)."""
    if isinstance(exc, (DeployError, ServingError, LimitError)):  # LimitError: a stored
        return str(exc)  # container's thread count the worker's reader refuses
    log.exception("endpoint %s: task failed", ep.name)
    return f"Internal error: {type(exc).__name__}: {exc}"


@_by_arn
def create(ctx: WorkerContext, ep: ResourceRef) -> str:
    try:
        return _create(ctx, ep)
    except capacity.WaitingForCapacity as waiting:  # lease released: another host may claim
        return capacity.hand_on(ctx, ep, ENDPOINT_CREATE_TASK, waiting)


def _create(ctx: WorkerContext, ep: ResourceRef) -> str:
    with EndpointLease(ctx, ep.arn, eps.CREATING) as lease:
        state = read_state(ctx, ep) if lease.held else None
        if state is None:
            return "skipped (not Creating, or another worker has it)"
        try:
            dep = fleet.launch(ctx, ep, state.config_name, None, eps.CREATING)
        except capacity.WaitingForCapacity:
            raise
        except capacity.Superseded:
            return "superseded"
        except Exception as exc:
            with ctx.db.session() as s:
                eps.mark_failed(s, ep.arn, _reason(ep, exc))
            return eps.FAILED
        with ctx.db.session() as s:
            ok = eps.mark_in_service(s, ep.arn, dep)
        if not ok:  # deleted (or timed out) while starting: nothing may keep running
            capacity.stop(ctx, ep, dep["Servers"])
            return "deleted-while-creating"
        return eps.IN_SERVICE


@_by_arn
def update(ctx: WorkerContext, ep: ResourceRef) -> str:
    """UpdateEndpoint (a pending config) or UpdateEndpointWeightsAndCapacities (none)."""
    try:
        return _update(ctx, ep)
    except capacity.WaitingForCapacity as waiting:
        return capacity.hand_on(ctx, ep, ENDPOINT_UPDATE_TASK, waiting)


def _update(ctx: WorkerContext, ep: ResourceRef) -> str:
    """The servers an update has taken out of service are stopped after its lease ends: an
    UpdateEndpoint accepted once this one is InService must not find the lease held (its
    task would be skipped and wait for the watchdog's re-send)."""
    retired: list[dict[str, Any]] = []
    try:
        with EndpointLease(ctx, ep.arn, eps.UPDATING) as lease:
            state = read_state(ctx, ep) if lease.held else None
            if state is None:
                return "skipped (not Updating, or another worker has it)"
            if not state.pending_config_name:
                return _scale(ctx, ep, state.config_name, state.servers, retired)
            return _replace_fleet(ctx, ep, state.pending_config_name, state.servers, retired)
    finally:
        for servers in retired:
            capacity.stop(ctx, ep, servers)


def _replace_fleet(ctx: WorkerContext, ep: ResourceRef, config_name: str,
                   old: dict[str, Any], retired: list[dict[str, Any]]) -> str:
    """UpdateEndpoint: the new fleet beside the old one, traffic shifted to it as the
    deployment configuration says (workers/serving/shift.py), then the old one stopped; any
    failure stops the new fleet and keeps the old one serving."""
    dep: dict[str, Any] | None = None
    try:
        dep = fleet.launch(ctx, ep, config_name, fleet.overrides(ctx, ep, new_config=True),
                           eps.UPDATING)
        plan = shift.plan_of(ctx, ep.arn, dep)
        if not shift.run(ctx, ep.arn, config_name, dep, plan, dead_instances):
            capacity.stop(ctx, ep, dep["Servers"])
            return "superseded"
    except capacity.WaitingForCapacity:
        raise  # launch stopped what it started; the old fleet serves meanwhile
    except capacity.Superseded:
        return "superseded"
    except Exception as exc:
        why = str(exc) if isinstance(exc, shift.ShiftFailed) else _reason(ep, exc)
        with ctx.db.session() as s:
            eps.rollback_update(s, ep.arn, f"Update to {config_name} failed and was rolled "
                                         f"back: {why}")
        if dep is not None:
            capacity.stop(ctx, ep, dep["Servers"])
        return "rolled-back"
    with ctx.db.session() as s:
        ok = eps.finish_update(s, ep.arn, dep)
    retired.append(old if ok else dep["Servers"])
    return eps.IN_SERVICE if ok else "superseded"


def _resize(ctx: WorkerContext, ep: ResourceRef, plans: dict[str, VariantPlan],
            servers: dict[str, Any], started: list[dict[str, Any]]
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each variant at its plan's weight and instance count: new instances are started
    (and listed in `started` as they come up), surplus ones dropped from the records.
    Returns the new records and, to stop once traffic has left them, the surplus ones."""
    new_servers, surplus = dict(servers), {}
    for variant, plan in plans.items():
        record, have = servers[variant], instances_of(servers[variant])
        if plan.instance_count > len(have):
            try:
                record, fresh = add_instances(plan, record, plan.instance_count,
                                              ctx.settings.advertise_host, ctx.children_dir,
                                              capacity.placement(ctx, ep))
            except NoCapacity as exc:
                raise capacity.capacity(ctx, ep, exc) from exc
            started.extend(fresh)
        elif plan.instance_count < len(have):
            surplus[variant] = {"instances": have[plan.instance_count:]}
            record = {**record, "instances": have[:plan.instance_count]}
        new_servers[variant] = {**record, "weight": plan.weight}
    return new_servers, surplus


def _scale(ctx: WorkerContext, ep: ResourceRef, config_name: str,
           servers: dict[str, Any], retired: list[dict[str, Any]]) -> str:
    """Apply UpdateEndpointWeightsAndCapacities live: instances are added or stopped, the
    others keep serving; the new weights take effect when the endpoint is InService."""
    started: list[dict[str, Any]] = []
    try:
        plans = {p.variant: p for p in fleet.plans(ctx, ep, config_name, fleet.overrides(ctx, ep))}
        if set(plans) != set(servers):
            raise DeployError(f"The variants of {config_name} no longer match the running ones.")
        new_servers, surplus = _resize(ctx, ep, plans, servers, started)
    except capacity.WaitingForCapacity:
        capacity.stop(ctx, ep, {"new": {"instances": started}})
        raise
    except Exception as exc:
        capacity.stop(ctx, ep, {"new": {"instances": started}})
        with ctx.db.session() as s:
            eps.rollback_weights(s, ep.arn, "Weights and capacities update failed: "
                                          f"{_reason(ep, exc)}")
        return "rolled-back"
    with ctx.db.session() as s:
        ok = eps.finish_weights(s, ep.arn, deployment(list(plans.values()), new_servers))
    retired.append(surplus if ok else {"new": {"instances": started}})
    return eps.IN_SERVICE if ok else "superseded"


@_by_arn
def delete(ctx: WorkerContext, ep: ResourceRef) -> str:
    with EndpointLease(ctx, ep.arn, eps.DELETING) as lease:
        state = read_state(ctx, ep) if lease.held else None
        if state is None:
            return "skipped (not Deleting, or another worker has it)"
        try:  # every instance: serving, shifted to, being placed; another host's by its own
            servers = spread.every_server(state.deployment)
            capacity.stop(ctx, ep, servers)
            spread.retire_pending(ctx, ep, sent=spread.split(ctx, servers)[1])
            with ctx.db.session() as s:  # and whatever else it still holds on this host
                placement_repo.release(s, ep.arn, hosts=[ctx.placer.host])
                endpoint_spread.handed_off(s, ep.arn, eps.DELETING)
            shutil.rmtree(fleet.work_dir(ctx, ep), ignore_errors=True)
        except Exception as exc:
            with ctx.db.session() as s:
                eps.mark_failed(s, ep.arn, f"Deleting failed: {_reason(ep, exc)}")
            return eps.FAILED
        with ctx.db.session() as s:
            done = eps.finish_delete(s, ep.arn)
        return "deleted" if done else "deleting (other hosts stop their instances)"


def _replace_dead(ctx: WorkerContext, ep: ResourceRef, config_name: str, servers: dict[str, Any],
                  dead: dict[str, list[int]], overrides: dict[str, dict[str, Any]]
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restart only the dead instances. Returns the new deployment and, to stop if it cannot
    be stored, the new instances alone (as variant records)."""
    plans = {p.variant: p for p in fleet.plans(ctx, ep, config_name, overrides)}
    if set(plans) != set(servers):
        raise DeployError(f"The variants of {config_name} no longer match the running ones.")
    new_servers, started = dict(servers), {}
    try:
        for variant, idx in dead.items():
            new_servers[variant] = restart_instances(plans[variant], servers[variant], idx,
                                                     ctx.settings.advertise_host,
                                                     ctx.children_dir,
                                                     capacity.placement(ctx, ep))
            fresh = [instances_of(new_servers[variant])[i] for i in idx]
            started[variant] = {"instances": fresh}
    except BaseException:
        capacity.stop(ctx, ep, started)
        raise
    return deployment(list(plans.values()), new_servers), started


@_by_arn
def retire(ctx: WorkerContext, ep: ResourceRef) -> str:
    """Stop this host's instances another host's task has retired (workers/serving/fleet.py)."""
    return fleet.retire(ctx, ep)


#: endpoints this worker is recovering now: a second recover task for one of them (several
#: failed requests each ask for one) must not restart the same processes again meanwhile
_recovering: set[str] = set()
_recovering_lock = threading.Lock()


@_by_arn
def recover(ctx: WorkerContext, ep: ResourceRef) -> str:
    with _recovering_lock:
        if ep.arn in _recovering:
            return "already-recovering"
        _recovering.add(ep.arn)
    try:
        return _recover(ctx, ep)
    finally:
        with _recovering_lock:
            _recovering.discard(ep.arn)


def _recover(ctx: WorkerContext, ep: ResourceRef) -> str:
    state = read_state(ctx, ep)
    if state is None or state.status not in (eps.IN_SERVICE, eps.SYSTEM_UPDATING):
        return "skipped"
    servers = state.servers
    dead = dead_instances(servers)
    if state.status == eps.IN_SERVICE:  # SystemUpdating: a recovery was cut short; redo it
        if servers and not dead:
            return "healthy"
        with ctx.db.session() as s:
            if not eps.begin_recovery(s, ep.arn, ctx.owner):
                return "skipped"
    try:
        with EndpointLease(ctx, ep.arn, eps.SYSTEM_UPDATING) as lease:
            if not lease.held:
                return "skipped (another worker recovers it)"
            return _restart(ctx, ep, state.config_name, servers, dead)
    except capacity.WaitingForCapacity as waiting:
        return capacity.hand_on(ctx, ep, ENDPOINT_RECOVER_TASK, waiting)


def _restart(ctx: WorkerContext, ep: ResourceRef, config_name: str, servers: dict[str, Any],
             dead: dict[str, list[int]]) -> str:
    total = sum(len(instances_of(rec)) for rec in servers.values())
    overrides = fleet.overrides(ctx, ep)  # the weights and counts the endpoint was given
    try:
        here, away, orphaned = spread.live_dead_hosts(ctx, servers, dead)
        if servers and sum(map(len, dead.values())) < total and not orphaned:
            # some still serve: keep them; this host restarts its own dead ones, and the
            # worker of each other host with dead ones its own, in turn
            dep, started = _replace_dead(ctx, ep, config_name, servers, here, overrides)
            if away:
                _hand_on_recovery(ctx, ep, dep, started, away[0])
        else:
            capacity.stop(ctx, ep, servers)
            dep = fleet.launch(ctx, ep, config_name, overrides, eps.SYSTEM_UPDATING)
            started = dep["Servers"]
    except capacity.WaitingForCapacity:
        raise  # SystemUpdating until a host can place it, or its wait fails it
    except capacity.Superseded:
        return "superseded"
    except Exception as exc:
        # a Failed endpoint serves nothing, not even its live instances
        capacity.stop(ctx, ep, servers)
        with ctx.db.session() as s:
            eps.mark_failed(s, ep.arn, f"Serving processes died and could not be restarted: "
                                     f"{_reason(ep, exc)}")
        return eps.FAILED
    with ctx.db.session() as s:
        if not eps.finish_recovery(s, ep.arn, dep):
            capacity.stop(ctx, ep, started)
    return "restarted"


def _hand_on_recovery(ctx: WorkerContext, ep: ResourceRef, dep: dict[str, Any],
                      started: dict[str, Any], host: str) -> None:
    """Record the instances restarted here; host `host`'s worker restarts its own next."""
    with ctx.db.session() as s:
        ok = endpoint_spread.save_deployment(s, ep.arn, ctx.owner, eps.SYSTEM_UPDATING, dep)
    if not ok:
        capacity.stop(ctx, ep, started)
        raise capacity.Superseded("The endpoint is no longer SystemUpdating.")
    raise capacity.WaitingForCapacity(None, host)


#: each endpoint task's name and what it runs (every one takes the endpoint's ARN)
TASKS: dict[str, Callable[[WorkerContext, str], str]] = {
    ENDPOINT_CREATE_TASK: create, ENDPOINT_UPDATE_TASK: update, ENDPOINT_DELETE_TASK: delete,
    ENDPOINT_RECOVER_TASK: recover, ENDPOINT_RETIRE_TASK: retire,
}


def register_tasks(app: Celery, ctx: WorkerContext) -> None:
    """The endpoint tasks on `app` (routed to queue `serve` by their names' prefix,
    workers/infra/celery_app.py), each running with `ctx`."""
    for name, run in TASKS.items():
        app.task(name=name, acks_late=True)(_with_context(ctx, run))


def _with_context(ctx: WorkerContext, run: Callable[[WorkerContext, str], str]
                  ) -> Callable[[str], str]:
    def task(ref: str) -> str:
        return run(ctx, ref)
    task.__name__ = task.__qualname__ = run.__name__
    return task
