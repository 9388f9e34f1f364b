"""create_celery(settings, broker_url): the worker's Celery app with our tasks."""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import (
    worker_process_init,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

from api.settings import Settings
from db.session import Database
from workers import endpoints, optimize
from workers.context import WorkerContext
from workers.queue import SERVE_QUEUE, TRAIN_QUEUE, TaskQueue
from workers.reconcile import reconcile, start_watchdog
from workers.serving.deploy import stop_servers

#: longer than any task may run: Redis redelivers an unacked task only after this
VISIBILITY_TIMEOUT = 48 * 3600


def create_celery(settings: Settings, broker_url: str) -> tuple[Celery, WorkerContext]:
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
        lease_seconds=settings.job_lease_seconds,
    )
    optimize.register(app, ctx)
    endpoints.register(app, ctx)

    def on_ready(**_: Any) -> None:
        reconcile(ctx)
        start_watchdog(ctx)

    def on_shutting_down(**_: Any) -> None:
        ctx.shutting_down.set()  # running jobs checkpoint, hand back, and are re-enqueued

    def on_shutdown(**_: Any) -> None:
        # Serving processes live in their own sessions (they survive a worker crash and
        # are adopted); a deliberate shutdown stops them, and the next start restarts
        # InService endpoints (reconcile -> recover).
        stop_servers({str(pid): {"pid": pid} for pid in ctx.serving_pids})

    def on_child_start(**_: Any) -> None:
        ctx.db.engine.dispose(close=False)  # never share pooled connections across fork

    worker_ready.connect(on_ready, weak=False)
    worker_process_init.connect(on_child_start, weak=False)
    worker_shutdown.connect(on_shutdown, weak=False)
    worker_shutting_down.connect(on_shutting_down, weak=False)
    return app, ctx
