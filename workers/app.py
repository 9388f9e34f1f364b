"""The worker's Celery app: infra's app and context (workers/infra/celery_app.py) with the
tasks of jobs/ (the optimization task) and serving/ (the endpoint tasks), which register
themselves. The one module that imports both rooms; `eaglenest worker` runs it."""

from __future__ import annotations

from celery import Celery

from eaglenest.foundation.queue import SERVE_QUEUE
from eaglenest.foundation.settings import Settings
from eaglenest.workers.infra.celery_app import create_celery
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.jobs import optimize
from eaglenest.workers.serving import endpoints
from eaglenest.workers.serving.endpoint_metrics import EndpointSampler


def create_worker_app(settings: Settings, broker_url: str,
                      queues: str = "") -> tuple[Celery, WorkerContext]:
    """create_celery's app and context with every task of ours registered on it; a worker
    that serves samples its model servers' figures (its context's metrics own the sampler)."""
    app, ctx = create_celery(settings, broker_url, queues)
    optimize.register_tasks(app, ctx)
    endpoints.register_tasks(app, ctx)
    if not queues or SERVE_QUEUE in queues.split(","):
        ctx.metrics.own(EndpointSampler(ctx, ctx.settings.metrics_sample_seconds))
    return app, ctx
