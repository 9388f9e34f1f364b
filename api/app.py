"""create_app(settings): the FastAPI application, every service of `MOUNTS` mounted on it.
Nothing is built at import time."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from eaglenest.api import cloudwatch, console
from eaglenest.api.edge import json_protocol
from eaglenest.api.edge.registry import Context
from eaglenest.api.runtime import proxy
from eaglenest.api.s3 import mount
from eaglenest.db.session import Database
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.queue import TaskQueue
from eaglenest.foundation.settings import Settings
from eaglenest.foundation.store.storage import make_store


def create_app(settings: Settings, broker_url: str | None = None) -> FastAPI:
    """Build the app. `broker_url` overrides settings (the embedded broker's address)."""
    url = broker_url or settings.broker_url
    if not url:
        raise ValueError("a broker URL is required (EAGLENEST_BROKER_URL or the embedded broker)")
    db = Database(settings.resolved_database_url())
    queue = TaskQueue(url, settings.broker_publish_timeout)
    ctx = Context(
        settings=settings, db=db, queue=queue,
        account=Account(settings.region, settings.account_id),
        store=make_store(settings), lease_seconds=settings.job_lease_seconds,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        app.state.metrics.start()  # the MetricBuffer's flusher (api/observability.py)
        yield
        await app.state.routes.close()
        # after the routes: invocations still finishing add their data first; then the
        # buffer writes what it holds and its thread ends
        await run_in_threadpool(app.state.metrics.close)
        await app.state.runtime_client.aclose()
        app.state.capture.close()
        queue.close()
        db.dispose()

    app = FastAPI(title="EagleNest", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.ctx = ctx
    for install in MOUNTS:
        install(app, ctx)
    return app


def health(app: FastAPI, _: Context) -> None:
    """GET /ping: always 200 while the API serves (a container health check)."""

    @app.get("/ping")
    async def ping() -> dict[str, str]:
        """The body says whether the broker answers: Create calls still succeed without it,
        and what they accept is dispatched once it is back."""
        up = await run_in_threadpool(app.state.broker.up)
        return {"status": "ok" if up else "degraded", "broker": "up" if up else "down"}


Mount = Callable[[FastAPI, Context], None]
#: Where the services are mounted, in this order; a new service is a folder under api/
#: with an `install(app, ctx)`, plus one line here. Plain-ASGI layers wrap what is
#: mounted before them: the last is the outermost and sees every request first.
MOUNTS: tuple[Mount, ...] = (
    json_protocol.install,  # POST / (SageMaker, Tagging API) and GET /metrics; first:
                            # its app.state.metrics is the runtime's too
    proxy.install,  # sagemaker-runtime: /endpoints/{name}/invocations[-response-stream]
    cloudwatch.install,  # CloudWatch (RPC v2 CBOR): /service/GraniteServiceVersion20100801/...
    console.install,  # GET/POST /console...
    health,  # GET /ping
    mount.install,  # S3: last, ahead of every other route (api/s3/routing.py)
)
