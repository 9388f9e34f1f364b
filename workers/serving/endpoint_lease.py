"""A worker's hold on one endpoint transition (db/endpoints_repo.py: claim / heartbeat).

`EndpointLease(ctx, arn, status)` claims the transition on entry (`held` is False when the
endpoint is in another status or a live worker owns it: the task then does nothing) and
heartbeats it every third of the lease until exit, when an owner that did not change the
status releases it. A worker that dies stops heartbeating; after a lease the watchdog sends
the task again (workers/infra/reconcile.py), and the next worker's claim succeeds.

The row's owner is the worker process, and a worker runs several tasks at once on its pool's
threads: two deliveries of one task (the API's message and the one reconcile re-sends at
worker start) can reach the same worker together. The database claim lets an owner claim
again (a recovery claims the SystemUpdating it set itself), so the lease also holds (ARN,
status) in this process: while one is held, a second lease on them here is not. A lease on
another status of the endpoint is not held back: an update marks the endpoint InService and
then stops the old servers inside its lease, and a DeleteEndpoint meanwhile must proceed.
"""

from __future__ import annotations

import logging
import threading

from eaglenest.db import endpoints_repo as eps
from eaglenest.foundation.host.loops import Loop
from eaglenest.workers.infra.context import WorkerContext

log = logging.getLogger("eaglenest.endpoints")

#: (ARN, status) of the leases held in this process
_held: set[tuple[str, str]] = set()
_held_lock = threading.Lock()


def _hold(key: tuple[str, str]) -> bool:
    with _held_lock:
        if key in _held:
            return False
        _held.add(key)
        return True


def _drop(key: tuple[str, str]) -> None:
    with _held_lock:
        _held.discard(key)


class EndpointLease:
    def __init__(self, ctx: WorkerContext, arn: str, status: str) -> None:
        self.ctx, self.arn, self.status = ctx, arn, status
        self.held = False
        # beats every third of the lease whatever a beat raises (foundation/host/loops.py), never
        # slower: a later beat would lose the lease
        every = ctx.lease_seconds / 3
        self._beats = Loop(f"endpoint-lease-{arn}", self._beat, every, max_backoff=every,
                           logger=log)

    def __enter__(self) -> EndpointLease:
        if not _hold((self.arn, self.status)):
            log.info("endpoint %s: another task of this worker holds it", self.arn)
            return self
        try:
            with self.ctx.db.session() as s:
                self.held = eps.claim(s, self.arn, self.status, self.ctx.owner,
                                      self.ctx.lease_seconds)
        finally:
            if not self.held:
                _drop((self.arn, self.status))
        if self.held:
            self._beats.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.held:
            return
        self._beats.stop(timeout=10)
        try:
            with self.ctx.db.session() as s:
                eps.release(s, self.arn, self.ctx.owner)
        except Exception as err:  # database blip: the lease expires on its own
            log.warning("could not release endpoint %s: %s", self.arn, err)
        finally:
            _drop((self.arn, self.status))

    def _beat(self) -> None:
        try:
            with self.ctx.db.session() as s:
                eps.heartbeat(s, self.arn, self.ctx.owner)
        except Exception as err:  # database blip: try again next beat
            log.warning("heartbeat for endpoint %s failed: %s", self.arn, err)
