"""`install(app, ctx)`: the S3 API's ASGI layer (api/s3/asgi.py) ahead of every other route
of the app, and the sweeper of idle multipart uploads (api/s3/uploads.py) for the app's
lifetime."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI

from eaglenest.api.edge.keyring import KeyRing
from eaglenest.api.edge.registry import Context
from eaglenest.api.s3.asgi import S3ASGI
from eaglenest.api.s3.uploads import sweep_forever
from eaglenest.foundation.settings import Settings
from eaglenest.foundation.store.storage import make_store


def install(app: FastAPI, ctx: Context) -> None:
    """Call last: the layer added last is the outermost, and S3 routes before the rest."""
    app.add_middleware(S3ASGI, store=ctx.store or make_store(ctx.settings),
                       settings=ctx.settings,
                       keyring=KeyRing(ctx.settings))
    app.router.lifespan_context = _with_sweeper(app.router.lifespan_context, ctx.settings)


def _with_sweeper(inner: Callable[[Any], AbstractAsyncContextManager[Any]],
                  settings: Settings) -> Callable[[Any], AbstractAsyncContextManager[Any]]:
    """The app's lifespan, with the sweeper running from its start to its end."""

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        task = asyncio.create_task(sweep_forever(settings), name="s3-multipart-sweeper")
        try:
            async with inner(app) as state:
                yield state
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return lifespan
