"""Blue/green traffic shifting of an UpdateEndpoint, run by the update task once the new
fleet is healthy beside the old one: each step of db/traffic_policy.py's plan puts its share
of traffic on the new fleet (endpoints_repo.shift_traffic) and waits its baking period,
watching the deadline (MaximumExecutionTimeoutInSeconds) and, with AutoRollbackConfiguration,
the new fleet's health. The caller finishes the update (all traffic on the new fleet, the
old one stopped) or rolls it back.

Every update runs here, one with no BlueGreenUpdatePolicy as one step of 100% baked for no
time of its own: the last step (100%) lasts at least as long as a router may route from what
it read before the step (`settled_seconds`), so once the endpoint says InService no request
goes to the old fleet, which is still up until the caller stops it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from eaglenest.db import endpoint_retention as retention
from eaglenest.db import endpoints_repo as eps
from eaglenest.db import traffic_policy
from eaglenest.db.repository import locate
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation.deployment import instances_of
from eaglenest.workers.infra.context import WorkerContext

#: how often a baking period looks at the clock, the row and the new fleet's health
POLL_SECONDS = 1.0
#: what a router's read of the row may take beyond route_cache_seconds: a read that began
#: before a step was written and ended after it is kept route_cache_seconds from its end
READ_MARGIN_SECONDS = 0.5


def settled_seconds(ctx: WorkerContext) -> float:
    """How long after a step is written every sagemaker-runtime router routes by it: a route
    snapshot expires route_cache_seconds after it was read (api/runtime/routes.py)."""
    ttl = ctx.settings.route_cache_seconds
    return ttl + READ_MARGIN_SECONDS if ttl > 0 else 0.0


class ShiftFailed(Exception):
    """The shift must be rolled back; the message says why."""


def plan_of(ctx: WorkerContext, arn: str, dep: dict[str, Any]) -> traffic_policy.Plan:
    with ctx.db.session() as s:
        row = locate(s, EndpointRow, arn)
        config = row.spec.get(retention.DEPLOYMENT_CONFIG) if row is not None else None
    size = sum(len(instances_of(rec)) for rec in dep["Servers"].values())
    return traffic_policy.plan(config, size)


def run(ctx: WorkerContext, arn: str, config_name: str, dep: dict[str, Any],
        plan: traffic_policy.Plan, dead: Callable[[dict[str, Any]], dict[str, list[int]]],
        ) -> bool:
    """Every step of `plan`; False when the endpoint left this update meanwhile (deleted,
    timed out): the caller stops the new fleet. Raises ShiftFailed to roll back."""
    start = time.monotonic()
    for i, (share, wait) in enumerate(plan.steps):
        if i == len(plan.steps) - 1:
            wait = max(wait, settled_seconds(ctx))
        message = (f"{share:.0%} of traffic on the new fleet (step {i + 1} of "
                   f"{len(plan.steps)}), baking for {wait:.0f} s")
        with ctx.db.session() as s:
            if not eps.shift_traffic(s, arn, dep, share, message):
                return False
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(POLL_SECONDS, left))
            with ctx.db.session() as s:
                if not eps.updating_to(s, arn, config_name):
                    return False
            _watch(plan, start, dep, dead)
    return True


def _watch(plan: traffic_policy.Plan, start: float, dep: dict[str, Any],
           dead: Callable[[dict[str, Any]], dict[str, list[int]]]) -> None:
    elapsed = time.monotonic() - start
    if plan.max_seconds is not None and elapsed > plan.max_seconds:
        raise ShiftFailed(f"the traffic shift took longer than MaximumExecutionTimeoutInSeconds "
                          f"({plan.max_seconds:.0f} s)")
    if plan.auto_rollback:
        failed = dead(dep["Servers"])
        if failed:
            where = ", ".join(f"{v} instance {i}" for v, idx in failed.items() for i in idx)
            raise ShiftFailed(f"the new fleet failed its health check while traffic shifted "
                              f"({where} did not answer /health); AutoRollbackConfiguration "
                              "rolled the update back")
