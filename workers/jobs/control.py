"""A running job's link to the database: lease heartbeat, stop requests, max runtime.

`JobControl.should_stop()` is cheap (reads flags the heartbeat thread maintains) and is
polled between training steps and benchmark levels. It turns true when the job was
stopped (StopOptimizationJob), deleted, or ran past `StoppingCondition.MaxRuntimeInSeconds`.

`JobControl.report(progress)` also hands the job's figures to the metric store and keeps
the training curve in the record (workers/jobs/job_metrics.py); what the worker process
has pending is written when the job's control ends.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from eaglenest.db import optimization_jobs_repo as jobs
from eaglenest.db.metrics_repo import Datum
from eaglenest.db.repository import locate
from eaglenest.db.tables import OptimizationJobRow
from eaglenest.foundation.accounts import ResourceRef
from eaglenest.foundation.host.loops import Loop
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.jobs.job_metrics import JobFigures

log = logging.getLogger("eaglenest.optimize")


class JobStopped(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason  # "stopped", "deleted", "max-runtime" or "shutdown"


class JobControl:
    def __init__(self, ctx: WorkerContext, ref: str, max_runtime: float | None,
                 started_at: float, interval: float | None = None) -> None:
        self.ctx, self.ref = ctx, ref  # the job's ARN
        parsed = ResourceRef.parse(ref)
        #: what its log lines say they are about (as workers/infra/celery_app.py's)
        self.about = parsed.local_key if parsed else ref
        self.account_id = parsed.account_id if parsed else ""
        self.figures = JobFigures(parsed.name if parsed else ref, self._add_data)
        self.interval = interval or ctx.lease_seconds / 3
        self.deadline = started_at + max_runtime if max_runtime else None
        self.reason: str | None = None
        # beats every `interval` whatever a beat raises (foundation/host/loops.py), never slower:
        # a later beat would lose the lease
        self._beats = Loop(f"heartbeat-{ref}", self.poll, self.interval,
                           max_backoff=self.interval, logger=log)

    def __enter__(self) -> JobControl:
        self._beats.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._beats.stop(timeout=10)
        if self.figures.added:  # written now: a pool process may end with the task
            self.ctx.metrics.flush()

    def poll(self) -> None:
        try:
            with self.ctx.db.session() as s:
                status = jobs.heartbeat(s, self.ref, self.ctx.owner)
        except Exception as exc:  # database blip: keep working, try again next beat
            log.warning("heartbeat for %s failed: %s", self.about, exc, extra={"job": self.about})
            return
        if status is None:
            self.reason = self.reason or "deleted"
        elif status == jobs.STOPPING:
            self.reason = self.reason or "stopped"
        if self.deadline is not None and time.time() > self.deadline:
            self.reason = self.reason or "max-runtime"

    def report(self, progress: dict[str, Any]) -> None:
        """Record what the job is doing (its stage; training step, loss, ETA; benchmark
        level, row, requests, ETA) for `eaglenest status`, with the training curve, and its
        figures in the metric store (workers/jobs/job_metrics.py). A database blip loses
        one report, never the job."""
        try:
            with self.ctx.db.session() as s:
                if self.figures.curve is None:  # a resumed job's curve goes on
                    row = locate(s, OptimizationJobRow, self.ref)
                    self.figures.seed((row.progress or {}).get("curve") if row else None,
                                      row.name if row else None)
                jobs.record_progress(s, self.ref, self.ctx.owner, self.figures.observe(progress))
        except Exception as exc:
            log.warning("progress of %s not recorded: %s", self.about, exc,
                        extra={"job": self.about})

    def _add_data(self, data: list[Datum]) -> None:
        self.ctx.metrics.add(self.account_id, data)

    def should_stop(self) -> bool:
        if self.deadline is not None and time.time() > self.deadline:
            self.reason = self.reason or "max-runtime"
        if self.ctx.shutting_down.is_set():
            self.reason = self.reason or "shutdown"
        return self.reason is not None

    def check(self) -> None:
        if self.should_stop():
            raise JobStopped(self.reason or "stopped")
