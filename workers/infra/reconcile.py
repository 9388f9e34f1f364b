"""Reconciliation: the database is the truth, the broker only a hint.

At worker start: jobs whose owner died are put back to STARTING (or STOPPED if a stop was
pending) and, with every other pending job and every endpoint in a transitional state,
re-enqueued, so nothing is stranded by a crash, a lost message or a broker that was down
when the API accepted the call.

While the worker runs, its watchdog thread
- every `BROKER_POLL_SECONDS`: pings the broker; when it answers again after not
  answering, re-sends every pending job and every transitional endpoint nobody owns (what
  the API accepted meanwhile is dispatched within seconds of the broker's return);
- every lease: resumes jobs whose worker died, re-sends STARTING jobs and transitional
  endpoints whose message is lost (unowned for a lease, queue empty) or whose worker died
  (owner silent for a lease), and ends endpoint transitions older than
  EAGLENEST_ENDPOINT_TRANSITION_SECONDS (db/endpoints_repo.time_out), reaps the
  children of dead owners on this host, and waits for this worker's own children that
  exited (a server that crashed, or one another worker stopped) and forgets their
  records (foundation/host/children.py `sweep`);
- every `host_metrics_seconds` (a minute): the host's figures into the metric store
  (workers/infra/host_metrics.py).
Duplicates are harmless: a job or endpoint transition is claimed by one worker only. Every
task is sent with the resource's ARN (it names the account: db/repository.locate).
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import select

from eaglenest.db import endpoints_repo, placement_repo
from eaglenest.db import optimization_jobs_repo as jobs
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation import queue as q
from eaglenest.foundation.host import children
from eaglenest.foundation.host.loops import Loop
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.infra.host_metrics import SAMPLE_SECONDS, HostSampler

log = logging.getLogger("eaglenest.reconcile")
BROKER_POLL_SECONDS = 1.0

_ENDPOINT_TASKS = {
    endpoints_repo.CREATING: q.ENDPOINT_CREATE_TASK,
    endpoints_repo.UPDATING: q.ENDPOINT_UPDATE_TASK,
    endpoints_repo.DELETING: q.ENDPOINT_DELETE_TASK,
    endpoints_repo.IN_SERVICE: q.ENDPOINT_RECOVER_TASK,  # restarts dead servers
    endpoints_repo.SYSTEM_UPDATING: q.ENDPOINT_RECOVER_TASK,
}


def reconcile(ctx: WorkerContext) -> dict[str, int]:
    with ctx.db.session() as s:
        reclaimed = jobs.reclaim_lost(s, ctx.lease_seconds)
        job_arns = sorted(set(reclaimed) | set(jobs.pending(s)))
        pending = select(EndpointRow.arn, EndpointRow.status).where(
            EndpointRow.status.in_(list(_ENDPOINT_TASKS))
        )
        endpoints = list(s.execute(pending))
    for arn in reclaimed:
        log.warning("job %s lost its worker; re-enqueued to resume from its checkpoint", arn)
    for arn in job_arns:
        ctx.queue.send(q.OPTIMIZE_TASK, arn, q.TRAIN_QUEUE)
    for arn, status in endpoints:
        ctx.queue.send(_ENDPOINT_TASKS[status], arn, q.SERVE_QUEUE)
    counts = {"jobs": len(job_arns), "endpoints": len(endpoints)}
    log.info("reconciled: re-enqueued %(jobs)d jobs and %(endpoints)d endpoints", counts)
    return counts


def reclaim_once(ctx: WorkerContext) -> list[str]:
    """Resume the jobs whose worker died, re-send lost STARTING ones; the resumed ARNs."""
    with ctx.db.session() as s:
        arns = jobs.reclaim_lost(s, ctx.lease_seconds)
        stale = jobs.stale_starting(s, ctx.lease_seconds)
    for arn in arns:
        log.warning("job %s lost its worker; re-enqueued to resume from its checkpoint", arn)
        ctx.queue.send(q.OPTIMIZE_TASK, arn, q.TRAIN_QUEUE)
    # A job accepted while the broker was down has no message anywhere. When the queue is
    # empty, STARTING jobs older than a lease are re-sent (a duplicate is a no-op: claiming
    # a job is atomic).
    if stale and ctx.queue.waiting(q.TRAIN_QUEUE) == 0:
        for arn in stale:
            if arn not in arns:
                log.warning("job %s was never picked up; re-enqueued", arn)
                ctx.queue.send(q.OPTIMIZE_TASK, arn, q.TRAIN_QUEUE)
    return arns


def sweep_endpoints(ctx: WorkerContext) -> list[str]:
    """Re-send the tasks of unattended transitional endpoints, time out overdue ones; the
    ARNs re-sent."""
    with ctx.db.session() as s:
        overdue = endpoints_repo.time_out(s, ctx.settings.endpoint_transition_seconds)
        unattended = endpoints_repo.unattended(s, ctx.lease_seconds)
    for arn in overdue:
        log.warning("endpoint %s stayed in transition past %.0f s; ended", arn,
                    ctx.settings.endpoint_transition_seconds)
    if unattended and ctx.queue.waiting(q.SERVE_QUEUE) == 0:
        for arn, status in unattended:
            log.warning("endpoint %s (%s) has no live worker; its task is sent again", arn,
                        status)
            ctx.queue.send(_ENDPOINT_TASKS[status], arn, q.SERVE_QUEUE)
        return [arn for arn, _ in unattended]
    return []


def resend_pending(ctx: WorkerContext) -> None:
    """Every STARTING job and every unowned transitional endpoint, sent again."""
    with ctx.db.session() as s:
        job_arns = jobs.pending(s)
        endpoints = list(s.execute(select(EndpointRow.arn, EndpointRow.status).where(
            EndpointRow.status.in_(endpoints_repo.TRANSITIONAL), EndpointRow.owner.is_(None))))
    for arn in job_arns:
        ctx.queue.send(q.OPTIMIZE_TASK, arn, q.TRAIN_QUEUE)
    for arn, status in endpoints:
        ctx.queue.send(_ENDPOINT_TASKS[status], arn, q.SERVE_QUEUE)
    log.warning("the broker answers again: re-sent %d jobs and %d endpoints", len(job_arns),
                len(endpoints))


def reclaim_gpus(ctx: WorkerContext) -> None:
    """Free the GPUs of dead workers and of holders that no longer exist or have ended."""
    with ctx.db.session() as s:
        dead = placement_repo.reclaim(s, ctx.lease_seconds)
        orphans = placement_repo.release_orphans(s, ctx.lease_seconds)
    for owner in dead:
        log.warning("worker %s is gone; the GPUs it held are free again", owner)
    for holder in orphans:
        log.warning("%s has ended or is gone; the GPUs it held are free again", holder)


def start_watchdog(ctx: WorkerContext,
                   host_metrics_seconds: float = SAMPLE_SECONDS) -> threading.Thread:
    """The watchdog thread (module docstring), until `ctx.shutting_down`. A check that
    fails is logged and tried again the next period; whatever escapes a check (not an
    Exception) is logged by foundation/host/loops.py and the thread goes on at the same pace
    (its GPU heartbeat must not fall behind)."""
    state = {"broker_up": True, "next_sweep": time.monotonic() + ctx.lease_seconds,
             "next_beat": time.monotonic() + ctx.lease_seconds / 3,
             "next_metrics": time.monotonic() + host_metrics_seconds}
    host = HostSampler(ctx)

    def sample_host() -> None:  # its own try: figures never hold up the checks above
        if time.monotonic() < state["next_metrics"]:
            return
        state["next_metrics"] = time.monotonic() + host_metrics_seconds
        try:
            host.sample()
        except Exception as exc:
            log.warning("host metrics not sampled: %s", exc)

    def check() -> None:
        try:
            up = ctx.queue.broker_up()
            if up and not state["broker_up"]:
                resend_pending(ctx)
            state["broker_up"] = up
            if time.monotonic() >= state["next_beat"]:
                state["next_beat"] = time.monotonic() + ctx.lease_seconds / 3
                ctx.placer.heartbeat()
            if time.monotonic() >= state["next_sweep"]:
                state["next_sweep"] = time.monotonic() + ctx.lease_seconds
                reclaim_once(ctx)
                sweep_endpoints(ctx)
                reclaim_gpus(ctx)
                children.reap(ctx.children_dir)  # e.g. a killed prefork pool process's
                children.sweep(ctx.children_dir)  # no zombie of ours outlives a lease
        except Exception as exc:  # database blip: try again next period
            log.warning("watchdog check failed: %s", exc)
        sample_host()

    return Loop("eaglenest-watchdog", check, BROKER_POLL_SECONDS, stop=ctx.shutting_down,
                max_backoff=BROKER_POLL_SECONDS, logger=log).start().thread
