"""The optimization-job task. It takes a job name, reloads state and exits cleanly when the
job was stopped or deleted.

The training pipeline itself (download, train, export, benchmark) is issue #4. Until it
lands this task does not claim the job: the job stays STARTING, visibly waiting, and Stop
and Delete act on it at once. Nothing here pretends to train.
"""

from __future__ import annotations

import logging

from celery import Celery

from db import optimization_jobs_repo as jobs
from db.common import find
from db.tables import OptimizationJobRow
from workers.context import WorkerContext
from workers.queue import OPTIMIZE_TASK

log = logging.getLogger("eaglenest.optimize")


def run_job(ctx: WorkerContext, job_name: str) -> str:
    with ctx.db.session() as s:
        row = find(s, OptimizationJobRow, job_name)
        if row is None:
            log.info("job %s was deleted; nothing to do", job_name)
            return "deleted"
        if row.status != jobs.STARTING:
            log.info("job %s is %s; nothing to do", job_name, row.status)
            return row.status
    log.warning(
        "job %s stays STARTING: this build has no optimization pipeline yet (issue #4)",
        job_name,
    )
    return "waiting-for-pipeline"


def register(app: Celery, ctx: WorkerContext) -> None:
    @app.task(name=OPTIMIZE_TASK, acks_late=True, reject_on_worker_lost=True)
    def optimize(job_name: str) -> str:
        return run_job(ctx, job_name)
