"""An endpoint transition's GPUs: where its instances are placed, how they are freed, and
what a transition does while no host can place them (workers/infra/placement.py).

Contract: `stop()` stops instances and frees the GPUs they held. A transition whose
instances cannot be placed raises `WaitingForCapacity` while it is younger than
EAGLENEST_CAPACITY_WAIT_SECONDS (`capacity()`), and the task body hands the task on with
`hand_on()` once its EndpointLease is released (so that another host's worker can claim
it); past the wait it fails (create, recover) or rolls back (update) with SageMaker's
insufficient-capacity reason.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from eaglenest.db.common import locate
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation.accounts import ResourceRef
from eaglenest.foundation.queue import SERVE_QUEUE
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.infra.placement import NoCapacity, capacity_reason
from eaglenest.workers.serving.deploy import DeployError, Placement
from eaglenest.workers.serving.records import stop_servers, units_of

log = logging.getLogger("eaglenest.endpoints")


def placement(ctx: WorkerContext, ep: ResourceRef) -> Placement:
    return Placement(ctx.placer, ep.arn)


def stop(ctx: WorkerContext, ep: ResourceRef, servers: dict[str, Any]) -> None:
    """Stop these instances and free the GPUs they held."""
    try:
        stop_servers(servers, ctx.children_dir)
    finally:
        units = units_of(servers)
        if units:
            ctx.placer.release(ep.arn, units)


class WaitingForCapacity(Exception):
    """No host can place the transition's instances yet, and its wait is not over: the
    task is handed on (workers/infra/placement.py route) once its lease is released."""

    def __init__(self, cause: NoCapacity) -> None:
        super().__init__(str(cause))
        self.cause = cause


def capacity(ctx: WorkerContext, ep: ResourceRef, exc: NoCapacity) -> Exception:
    """WaitingForCapacity while the transition is younger than
    EAGLENEST_CAPACITY_WAIT_SECONDS, else the DeployError that fails it (or rolls it back)."""
    with ctx.db.session() as s:
        row = locate(s, EndpointRow, ep.arn)
        since = row.last_modified_time if row is not None else 0.0
    if time.time() - since < ctx.settings.capacity_wait_seconds:
        return WaitingForCapacity(exc)
    return DeployError(capacity_reason(exc.instance_type.name, exc.why))


def hand_on(ctx: WorkerContext, ep: ResourceRef, task: str, waiting: WaitingForCapacity
             ) -> str:
    where = ctx.placer.route(ctx.queue, task, ep.arn, SERVE_QUEUE, waiting.cause.instance_type)
    log.info("endpoint %s waits for capacity (%s); task sent to %s", ep.name, waiting, where)
    return f"waiting for capacity ({where})"
