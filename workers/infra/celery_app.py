"""create_celery(settings, broker_url): the worker's Celery app, before any task.

Its configuration, routing (`eaglenest.optimize` to queue `train`, `eaglenest.endpoint.*`
to `serve`) and signal handlers (start-up reaping and reconciliation, shutdown, log
context) are here; the tasks are registered by jobs/ and serving/ themselves, composed in
workers/app.py."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import (
    setup_logging,
    task_postrun,
    task_prerun,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

from eaglenest.db.session import Database
from eaglenest.foundation.accounts import ResourceRef
from eaglenest.foundation.host import children
from eaglenest.foundation.queue import OPTIMIZE_TASK, SERVE_QUEUE, TRAIN_QUEUE, TaskQueue
from eaglenest.foundation.settings import Settings
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.infra.logs import (
    configure_logging,
    enter_context,
    leave_context,
    redirect_output,
)
from eaglenest.workers.infra.reconcile import reclaim_gpus, reconcile, start_watchdog

log = logging.getLogger("eaglenest.worker")
#: longer than any task may run: Redis redelivers an unacked task only after this
VISIBILITY_TIMEOUT = 48 * 3600
#: log-context tokens of the tasks running now, by task id (see _task_started)
_log_tokens: dict[str, Any] = {}


def task_log_fields(task_name: str, args: Any) -> dict[str, str]:
    """What a task's log lines say they are about: `job` for the optimization task,
    `endpoint` for endpoint tasks, as `<account>/<name>` (every task takes the resource's
    ARN; a bare name, queued by an older version, as it stands)."""
    if not args:
        return {}
    ref = ResourceRef.parse(str(args[0]))
    about = ref.local_key if ref else str(args[0])
    if task_name == OPTIMIZE_TASK:
        return {"job": about}
    if task_name.startswith("eaglenest.endpoint."):
        return {"endpoint": about}
    return {}


def _task_started(task_id: str | None = None, task: Any = None, args: Any = None,
                  **_: Any) -> None:
    # prerun, the task body, Celery's "succeeded"/"raised" line and postrun all run in the
    # same thread (or prefork child): everything logged in between carries job / endpoint
    if task_id and task is not None:
        _log_tokens[task_id] = enter_context(**task_log_fields(task.name, args))


def _task_finished(task_id: str | None = None, **_: Any) -> None:
    token = _log_tokens.pop(task_id or "", None)
    if token is not None:
        leave_context(token)


def create_celery(settings: Settings, broker_url: str,
                  queues: str = "") -> tuple[Celery, WorkerContext]:
    """The app and the context its tasks share; `queues` are those the worker consumes
    (train, serve), offered to GPU placement."""
    app = Celery("eaglenest", broker=broker_url, set_as_current=True)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        worker_max_tasks_per_child=1,  # prefork pool (GPU train workers): a fresh process
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT},
        task_default_queue=TRAIN_QUEUE,
        task_routes={"eaglenest.optimize": {"queue": TRAIN_QUEUE},
                     "eaglenest.endpoint.*": {"queue": SERVE_QUEUE}},
    )
    ctx = WorkerContext(
        settings=settings, db=Database(settings.resolved_database_url()),
        queue=TaskQueue(broker_url, settings.broker_publish_timeout),
        lease_seconds=settings.job_lease_seconds, queues=queues,
    )

    def on_ready(**_: Any) -> None:
        children.reap(ctx.children_dir)  # what a dead worker on this host left running
        reclaim_gpus(ctx)  # and the GPUs dead workers held
        ctx.placer.register()
        reconcile(ctx)
        start_watchdog(ctx, ctx.settings.metrics_sample_seconds)
        ctx.metrics.start()  # the samplers the rooms gave it (workers/app.py)

    def on_shutting_down(**_: Any) -> None:
        ctx.shutting_down.set()  # running jobs checkpoint, hand back, and are re-enqueued

    def on_shutdown(**_: Any) -> None:
        ctx.metrics.close()  # samplers stopped, pending figures written
        # Every child (serving instances included) dies with this process; a deliberate
        # shutdown stops them first, and the next start restarts InService endpoints
        # (reconcile -> recover).
        children.stop_owned(ctx.children_dir)
        try:
            ctx.placer.unregister()  # its children are gone: so are its GPU holdings
        except Exception as exc:  # database down: the next worker reclaims them
            log.warning("could not release this worker's GPUs: %s", exc)

    def on_child_start(**_: Any) -> None:
        ctx.db.engine.dispose(close=False)  # never share pooled connections across fork

    def on_child_end(**_: Any) -> None:
        ctx.metrics.close()  # a pool process's own buffer: what its job added, written

    def on_setup_logging(loglevel: Any = None, **_: Any) -> None:
        # A receiver here means Celery leaves logging to us: our format (text or JSON,
        # EAGLENEST_LOG_FORMAT) at the worker's --loglevel, Celery's own loggers included;
        # print() and tqdm output become INFO records (not Celery's WARNING
        # celery.redirected lines): a progress bar is not a warning.
        configure_logging(settings.log_format, loglevel or "INFO")
        if app.conf.worker_redirect_stdouts:
            redirect_output()

    setup_logging.connect(on_setup_logging, weak=False, dispatch_uid="eaglenest-logging")
    task_prerun.connect(_task_started, weak=False, dispatch_uid="eaglenest-log-context")
    task_postrun.connect(_task_finished, weak=False, dispatch_uid="eaglenest-log-context")
    worker_ready.connect(on_ready, weak=False)
    worker_process_init.connect(on_child_start, weak=False)
    worker_process_shutdown.connect(on_child_end, weak=False)
    worker_shutdown.connect(on_shutdown, weak=False)
    worker_shutting_down.connect(on_shutting_down, weak=False)
    return app, ctx
