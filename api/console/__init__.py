"""The web console at /console: sign in with an access key pair, see the account's models,
jobs, endpoints and hosts (docs/observability.md)."""

from __future__ import annotations

from fastapi import FastAPI

from eaglenest.api.edge.registry import Context


def install(app: FastAPI, ctx: Context) -> None:
    """Mount the console's routes on `app`."""
