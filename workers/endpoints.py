"""Endpoint lifecycle tasks, by endpoint name (queue `serve`).

create: start one serving process per production variant; InService when every /health
answers, else Failed with the reason (bad model files, process exited, health timeout).
update: start the new config's processes beside the old ones, switch traffic when healthy,
then stop the old ones; on failure stop the new ones and keep serving the old (rollback).
delete: stop the processes, remove the row. recover: after a restart, restart the
processes of an InService endpoint whose servers no longer answer, or mark it Failed.
"""

from __future__ import annotations

import logging
import shutil
from typing import Any

import httpx
from celery import Celery

from db import endpoints_repo as eps
from db.common import find
from db.tables import EndpointRow
from workers.context import WorkerContext
from workers.queue import (
    ENDPOINT_CREATE_TASK,
    ENDPOINT_DELETE_TASK,
    ENDPOINT_RECOVER_TASK,
    ENDPOINT_UPDATE_TASK,
)
from workers.serving.deploy import (
    DeployError,
    deployment,
    plan_variants,
    start_variant,
    stop_servers,
)
from workers.serving.process import ServingError
from workers.storage import make_store

log = logging.getLogger("eaglenest.endpoints")


def _row(ctx: WorkerContext, name: str) -> tuple[str, str, str | None, dict[str, Any]] | None:
    with ctx.db.session() as s:
        row = find(s, EndpointRow, name)
        if row is None:
            return None
        return row.status, row.config_name, row.pending_config_name, dict(row.deployment)


def _launch(ctx: WorkerContext, name: str, config_name: str) -> dict[str, Any]:
    """Start every variant of `config_name`; on any failure stop what started and raise."""
    with ctx.db.session() as s:
        plans = plan_variants(s, config_name)
    store, servers = make_store(ctx.settings), {}
    workdir = ctx.settings.data_dir / "endpoints" / name
    try:
        for plan in plans:
            servers[plan.variant] = start_variant(store, workdir, name, plan,
                                                  ctx.settings.advertise_host)
            ctx.serving_pids.add(servers[plan.variant]["pid"])
    except BaseException:
        stop_servers(servers)
        raise
    return deployment(plans, servers)


def create(ctx: WorkerContext, name: str) -> str:
    state = _row(ctx, name)
    if state is None or state[0] != eps.CREATING:
        return f"skipped ({state[0] if state else 'deleted'})"
    try:
        dep = _launch(ctx, name, state[1])
    except (DeployError, ServingError) as exc:
        with ctx.db.session() as s:
            eps.mark_failed(s, name, str(exc)[:1024])
        return eps.FAILED
    with ctx.db.session() as s:
        ok = eps.mark_in_service(s, name, dep)
    if not ok:  # deleted while starting: nothing may keep running
        stop_servers(dep["Servers"])
        return "deleted-while-creating"
    return eps.IN_SERVICE


def update(ctx: WorkerContext, name: str) -> str:
    state = _row(ctx, name)
    if state is None or state[0] != eps.UPDATING or not state[2]:
        return f"skipped ({state[0] if state else 'deleted'})"
    old = state[3].get("Servers", {})
    try:
        dep = _launch(ctx, name, state[2])
    except (DeployError, ServingError) as exc:
        with ctx.db.session() as s:
            eps.rollback_update(s, name, f"Update to {state[2]} failed and was rolled back: "
                                         f"{exc}"[:1024])
        return "rolled-back"
    with ctx.db.session() as s:
        ok = eps.finish_update(s, name, dep)
    stop_servers(old if ok else dep["Servers"])
    return eps.IN_SERVICE if ok else "superseded"


def delete(ctx: WorkerContext, name: str) -> str:
    state = _row(ctx, name)
    if state is None or state[0] != eps.DELETING:
        return f"skipped ({state[0] if state else 'deleted'})"
    stop_servers(state[3].get("Servers", {}))
    shutil.rmtree(ctx.settings.data_dir / "endpoints" / name, ignore_errors=True)
    with ctx.db.session() as s:
        eps.finish_delete(s, name)
    return "deleted"


def _healthy(servers: dict[str, Any]) -> bool:
    try:
        return bool(servers) and all(
            httpx.get(f"{s['url']}/health", timeout=3).status_code == 200
            for s in servers.values())
    except httpx.HTTPError:
        return False


def recover(ctx: WorkerContext, name: str) -> str:
    state = _row(ctx, name)
    if state is None or state[0] not in (eps.IN_SERVICE, eps.SYSTEM_UPDATING):
        return "skipped"
    if state[0] == eps.IN_SERVICE:  # SystemUpdating: a recovery was cut short; redo it
        if _healthy(state[3].get("Servers", {})):
            return "healthy"
        with ctx.db.session() as s:
            if not eps.begin_recovery(s, name):
                return "skipped"
    stop_servers(state[3].get("Servers", {}))
    try:
        dep = _launch(ctx, name, state[1])
    except (DeployError, ServingError) as exc:
        with ctx.db.session() as s:
            eps.mark_failed(s, name, f"Serving processes died and could not be restarted: "
                                     f"{exc}"[:1024])
        return eps.FAILED
    with ctx.db.session() as s:
        if not eps.finish_recovery(s, name, dep):
            stop_servers(dep["Servers"])
    return "restarted"


def register(app: Celery, ctx: WorkerContext) -> None:
    @app.task(name=ENDPOINT_CREATE_TASK, acks_late=True)
    def create_endpoint(name: str) -> str:
        return create(ctx, name)

    @app.task(name=ENDPOINT_UPDATE_TASK, acks_late=True)
    def update_endpoint(name: str) -> str:
        return update(ctx, name)

    @app.task(name=ENDPOINT_DELETE_TASK, acks_late=True)
    def delete_endpoint(name: str) -> str:
        return delete(ctx, name)

    @app.task(name=ENDPOINT_RECOVER_TASK, acks_late=True)
    def recover_endpoint(name: str) -> str:
        return recover(ctx, name)
