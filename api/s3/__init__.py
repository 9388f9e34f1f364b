"""An S3-compatible API (path-style) on the SageMaker API's own endpoint, over the
configured artifact store (docs/s3-api.md). `install(app, ctx)` puts its ASGI layer
(api/s3/asgi.py) ahead of every other route of the app."""

from __future__ import annotations

from fastapi import FastAPI

from eaglenest.api.keyring import KeyRing
from eaglenest.api.registry import Context
from eaglenest.api.s3.asgi import S3ASGI
from eaglenest.foundation.storage import make_store


def install(app: FastAPI, ctx: Context) -> None:
    """Call last: the layer added last is the outermost, and S3 routes before the rest."""
    app.add_middleware(S3ASGI, store=ctx.store or make_store(ctx.settings),
                       settings=ctx.settings,
                       keyring=KeyRing(ctx.settings))
