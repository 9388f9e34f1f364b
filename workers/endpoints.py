"""Endpoint lifecycle tasks, by endpoint name.

Serving backends (vLLM, embedded) are issue #5. Until then Create and Update leave the
endpoint Creating / Updating (no process is started, so none is pretended), and Delete
finishes the teardown of whatever the row says is deployed.
"""

from __future__ import annotations

import logging

from celery import Celery

from db import endpoints_repo
from db.common import find
from db.tables import EndpointRow
from workers.context import WorkerContext
from workers.queue import ENDPOINT_CREATE_TASK, ENDPOINT_DELETE_TASK, ENDPOINT_UPDATE_TASK

log = logging.getLogger("eaglenest.endpoints")


def _status(ctx: WorkerContext, name: str) -> str | None:
    with ctx.db.session() as s:
        row = find(s, EndpointRow, name)
        return row.status if row else None


def create(ctx: WorkerContext, name: str) -> str:
    status = _status(ctx, name)
    if status != endpoints_repo.CREATING:
        return f"skipped ({status})"
    log.warning("endpoint %s stays Creating: no serving backend in this build (issue #5)", name)
    return "waiting-for-backend"


def update(ctx: WorkerContext, name: str) -> str:
    status = _status(ctx, name)
    if status != endpoints_repo.UPDATING:
        return f"skipped ({status})"
    log.warning("endpoint %s stays Updating: no serving backend in this build (issue #5)", name)
    return "waiting-for-backend"


def delete(ctx: WorkerContext, name: str) -> str:
    status = _status(ctx, name)
    if status != endpoints_repo.DELETING:
        return f"skipped ({status})"
    with ctx.db.session() as s:
        endpoints_repo.finish_delete(s, name)
    return "deleted"


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
