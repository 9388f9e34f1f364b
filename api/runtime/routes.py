"""sagemaker-runtime's routing: an endpoint's variants and instances, cached from the database.

A request goes to a variant by weight (or TargetVariant), then round-robin to one of that
variant's instances. While a blue/green update shifts traffic (db/traffic_policy.py), a
request first goes to the new fleet with the step's probability, else to the old one. An
endpoint's rows are kept at most `ttl` seconds and, while it is in use, re-read in the
background before they expire (a thread hop and two queries per invocation otherwise); a
caller that found an instance gone asks for a fresh read.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import threading
import time
from typing import Any

from fastapi.concurrency import run_in_threadpool

from eaglenest.api.edge.registry import Context
from eaglenest.api.runtime.bodies import RuntimeValidationError
from eaglenest.db.endpoint_retention import capture_config
from eaglenest.db.endpoints_repo import SHIFT
from eaglenest.db.repository import find
from eaglenest.db.tables import EndpointConfigRow, EndpointRow
from eaglenest.foundation.deployment import instances_of

log = logging.getLogger("eaglenest.runtime")

#: statuses that take requests: SystemUpdating restarts dead instances while the live ones
#: serve (SageMaker serves during its maintenance too)
SERVING = ("InService", "Updating", "SystemUpdating")


class Route:
    def __init__(self, variant: str, urls: list[str], served: str,
                 capture: dict[str, Any] | None, status: str, cached: bool = False,
                 secrets: dict[str, str] | None = None, arn: str = "", endpoint: str = ""):
        #: the variant's instances, the one whose turn it is first
        self.variant, self.urls, self.served, self.capture = variant, urls, served, capture
        #: the endpoint's name as it was created (a caller may write it in another case):
        #: the EndpointName of its metrics
        self.endpoint = endpoint
        self.status, self.cached = status, cached
        #: the endpoint's ARN: what a recovery task is sent with
        self.arn = arn
        #: url -> the instance's secret (foundation/http/instance_auth.py)
        self.secrets = secrets or {}


class _Snapshot:
    """What an invocation needs from an endpoint's rows, read in one session."""

    def __init__(self, servers: dict[str, Any], status: str,
                 capture: dict[str, Any] | None, expires: float, arn: str,
                 shift: dict[str, Any] | None = None, name: str = "") -> None:
        self.servers, self.status, self.capture = servers, status, capture
        self.name = name  # the endpoint's name as it was created
        self.expires, self.arn = expires, arn
        #: the new fleet's servers and its share of traffic during a blue/green update
        self.shift = shift


_turns: dict[tuple[str, str], itertools.count[int]] = {}
_turns_lock = threading.Lock()


def _rotation(arn: str, variant: str, urls: list[str]) -> list[str]:
    """Round-robin over a variant's instances: each call starts one further along."""
    with _turns_lock:
        turn = next(_turns.setdefault((arn, variant), itertools.count()))
    start = turn % len(urls)
    return urls[start:] + urls[:start]


def not_found(name: str, account_id: str) -> RuntimeValidationError:
    return RuntimeValidationError(f"Endpoint {name} of account {account_id} not found.")


def _load(ctx: Context, name: str, ttl: float, account_id: str) -> _Snapshot:
    """The endpoint's snapshot; not found unless it is `account_id`'s."""
    with ctx.db.session() as s:
        row = find(s, EndpointRow, name, account_id=account_id)
        if row is None:
            raise not_found(name, account_id)
        if row.status not in SERVING or not row.deployment.get("Servers"):
            raise RuntimeValidationError(
                f"Endpoint {name} is not in service (status {row.status}).")
        config = find(s, EndpointConfigRow, row.config_name, account_id=account_id)
        capture = capture_config(row.spec, config.spec if config else None)
        shift = row.deployment.get(SHIFT)
        return _Snapshot(dict(row.deployment["Servers"]), row.status, capture,
                         time.monotonic() + ttl, row.arn, dict(shift) if shift else None,
                         row.name)


#: a cached endpoint: (account, lower-cased name); two accounts may each have one name
Key = tuple[str, str]


class Routes:
    """(Account, endpoint name) -> its serving snapshot, at most `ttl` seconds old;
    `fresh=True` (after an instance refused a connection) reads it again.

    The snapshots of endpoints invoked in the last `idle_after` seconds are re-read in the
    background about every `3/4 ttl` seconds, so an invocation does not wait for the database
    (a thread hop and two queries) unless its endpoint was idle or its instance refused the
    connection; a cache filled by requests alone would miss on every request of a caller
    slower than `ttl`.
    """

    def __init__(self, ctx: Context, ttl: float, idle_after: float = 300.0) -> None:
        self.ctx, self.ttl, self.idle_after = ctx, ttl, idle_after
        self._snapshots: dict[Key, _Snapshot] = {}
        self._used: dict[Key, float] = {}  # endpoint -> time.monotonic() of its last request
        self._refresher: asyncio.Task[None] | None = None
        self._read_s = 0.0  # how long the refresher's last database read took

    async def resolve(self, name: str, target_variant: str | None,
                      fresh: bool = False, *, account_id: str | None = None) -> Route:
        """The route of `account_id`'s endpoint `name` (another account's: not found;
        default: the context's account)."""
        account_id = account_id or self.ctx.account.account_id
        key = (account_id, name.lower())
        now = time.monotonic()
        snap = self._snapshots.get(key)
        cached = not fresh and snap is not None and snap.expires > now
        if not cached:
            self._snapshots.pop(key, None)
            snap = await run_in_threadpool(_load, self.ctx, name, self.ttl, account_id)
            if self.ttl > 0:
                self._snapshots[key] = snap
        if self.ttl > 0:
            self._used[key] = now
            if self._refresher is None:
                self._refresher = asyncio.create_task(self._refresh())
        assert snap is not None
        return _choose(name, snap, target_variant, cached)

    async def _refresh(self) -> None:
        """Re-read the snapshots of recently used endpoints before they expire; forget the
        idle ones; stop when none is left (the next request starts it again).

        It wakes every ttl/4 and re-reads a snapshot with 3/8 ttl, plus what the last read
        took, or less left. With a quick database that is once every 3/4 ttl: the wake 3/4
        ttl after a read finds 1/4 ttl left, and the new snapshot lands at least 1/8 ttl
        before the old one expires.
        """
        quarter = self.ttl / 4
        try:
            while self._used:
                await asyncio.sleep(quarter)
                now = time.monotonic()
                for key, last in list(self._used.items()):
                    if now - last > self.idle_after:
                        del self._used[key]
                        self._snapshots.pop(key, None)
                        continue
                    snap = self._snapshots.get(key)
                    if snap is None or snap.expires - now <= 1.5 * quarter + self._read_s:
                        await self._reload(key)
        finally:
            self._refresher = None

    async def _reload(self, key: Key) -> None:
        t0 = time.monotonic()
        account_id, name = key
        try:
            self._snapshots[key] = await run_in_threadpool(_load, self.ctx, name, self.ttl,
                                                           account_id)
            self._read_s = time.monotonic() - t0
        except RuntimeValidationError:  # gone or not serving: the next request says so
            self._snapshots.pop(key, None)
            self._used.pop(key, None)
        except Exception as exc:  # the database is unreachable: requests read it themselves
            log.warning("could not refresh the routes of endpoint %s of account %s: %s", name,
                        account_id, exc)
            self._snapshots.pop(key, None)

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher


def _fleets(snap: _Snapshot) -> list[dict[str, Any]]:
    """The fleets to route to, the one this request goes to first."""
    if not snap.shift:
        return [snap.servers]
    new = dict(snap.shift["Servers"])
    if random.random() < float(snap.shift["Fraction"]):
        return [new, snap.servers]
    return [snap.servers, new]


def _choose(name: str, snap: _Snapshot, target_variant: str | None, cached: bool) -> Route:
    fleets = _fleets(snap)
    servers = fleets[0]
    if target_variant:
        having = [f for f in fleets if target_variant in f]
        if not having:
            raise RuntimeValidationError(
                f"Target variant {target_variant} does not exist on endpoint {name}.")
        servers, chosen = having[0], target_variant
    else:
        names = list(servers)
        weights = [float(servers[n].get("weight", 1.0)) for n in names]
        chosen = random.choices(names, weights=weights if sum(weights) > 0 else None)[0]
    srv = servers[chosen]
    instances = instances_of(srv)
    urls = _rotation(snap.arn, chosen, [str(i["url"]) for i in instances])
    secrets = {str(i["url"]): str(i["secret"]) for i in instances if i.get("secret")}
    return Route(chosen, urls, srv.get("served_name", name), snap.capture, snap.status,
                 cached, secrets, snap.arn, snap.name or name)
