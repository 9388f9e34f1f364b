"""Start-up reconciliation: the database is the truth, the broker only a hint.

Jobs whose owner died are put back to STARTING (or STOPPED if a stop was pending) and,
with every other pending job and endpoint, re-enqueued, so no job or endpoint is stranded
by a crash, a lost message or a broker that was down when the API accepted the call.
"""

from __future__ import annotations

import logging

from sqlalchemy import select

from db import endpoints_repo
from db import optimization_jobs_repo as jobs
from db.tables import EndpointRow
from workers import queue as q
from workers.context import WorkerContext

log = logging.getLogger("eaglenest.reconcile")

_ENDPOINT_TASKS = {
    endpoints_repo.CREATING: q.ENDPOINT_CREATE_TASK,
    endpoints_repo.UPDATING: q.ENDPOINT_UPDATE_TASK,
    endpoints_repo.DELETING: q.ENDPOINT_DELETE_TASK,
    endpoints_repo.IN_SERVICE: q.ENDPOINT_RECOVER_TASK,  # restarts dead servers
    endpoints_repo.SYSTEM_UPDATING: q.ENDPOINT_RECOVER_TASK,
}


def reconcile(ctx: WorkerContext) -> dict[str, int]:
    with ctx.db.session() as s:
        job_names = jobs.reclaim_lost(s, ctx.lease_seconds)
        pending = select(EndpointRow.name, EndpointRow.status).where(
            EndpointRow.status.in_(list(_ENDPOINT_TASKS))
        )
        endpoints = list(s.execute(pending))
    for name in job_names:
        ctx.queue.send(q.OPTIMIZE_TASK, name, q.TRAIN_QUEUE)
    for name, status in endpoints:
        ctx.queue.send(_ENDPOINT_TASKS[status], name, q.SERVE_QUEUE)
    counts = {"jobs": len(job_names), "endpoints": len(endpoints)}
    log.info("reconciled: re-enqueued %(jobs)d jobs and %(endpoints)d endpoints", counts)
    return counts
