"""An endpoint transition's GPUs: where its instances are placed, how they are freed, and
what a transition does while no host can place them (workers/infra/placement.py).

Contract: `stop()` stops instances and frees the GPUs they held (on any host: its own
worker stops them, workers/serving/spread.py). A transition whose
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

from eaglenest.db.repository import locate
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation.accounts import ResourceRef
from eaglenest.foundation.queue import SERVE_QUEUE
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.infra.placement import RETRY_SECONDS, NoCapacity, capacity_reason, host_queue
from eaglenest.workers.serving import spread
from eaglenest.workers.serving.deploy import DeployError, Placement

log = logging.getLogger("eaglenest.endpoints")


def placement(ctx: WorkerContext, ep: ResourceRef) -> Placement:
    return Placement(ctx.placer, ep.arn)


def stop(ctx: WorkerContext, ep: ResourceRef, servers: dict[str, Any]) -> None:
    """Stop these instances and free the GPUs they held: this host's here, another host's
    by its worker (workers/serving/spread.py)."""
    here, away = spread.split(ctx, servers)
    try:
        spread.stop_here(ctx, ep, here)
    finally:
        spread.retire_remote(ctx, ep, away)


class Superseded(Exception):
    """The transition is no longer this worker's (deleted, timed out, taken over) while it
    was being handed to another host: what it started is stopped, nothing is marked."""


class WaitingForCapacity(Exception):
    """The transition goes on on another host once its lease is released: no host can
    place its instances yet and its wait is not over (`cause`: the task is routed by
    workers/infra/placement.py), or host `then` is to start the rest of them."""

    def __init__(self, cause: NoCapacity | None, then: str | None = None) -> None:
        super().__init__(str(cause) if cause else f"host {then} goes on with it")
        self.cause, self.then = cause, then


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
    if waiting.cause is None:
        where = host_queue(SERVE_QUEUE, str(waiting.then))
        ctx.queue.send(task, ep.arn, where)
        log.info("endpoint %s: %s; task sent to %s", ep.name, waiting, where)
        return f"handed to {where}"
    if isinstance(waiting.cause, spread.Nowhere):  # no host to go to: its queue, later
        ctx.queue.send(task, ep.arn, SERVE_QUEUE, countdown=RETRY_SECONDS)
        log.info("endpoint %s waits for capacity (%s)", ep.name, waiting)
        return f"waiting for capacity ({SERVE_QUEUE})"
    where = ctx.placer.route(ctx.queue, task, ep.arn, SERVE_QUEUE, waiting.cause.instance_type)
    log.info("endpoint %s waits for capacity (%s); task sent to %s", ep.name, waiting, where)
    return f"waiting for capacity ({where})"
