"""The web console at /console: sign in with an access key pair, see the account's models,
jobs (stage progress, training curve, benchmark), endpoints (variants, instances, live
invocation, latency and tau charts) and hosts; stop a job, delete an endpoint.

Modules: `session` (the signed cookie, CSRF tokens, the sign-in limiter), `web` (the
shared `Console`, security headers, replies), `pages` (GET routes), `actions` (POST
routes), `views` (what a page reads, per account), `stages`, `figures` and `charts` (the
progress bars and the server-drawn SVG charts); templates/ and static/ (one stylesheet, one
script, both served from this origin: nothing is fetched from elsewhere).
"""

from __future__ import annotations

from fastapi import FastAPI

from eaglenest.api.console.actions import add_actions, add_fallback
from eaglenest.api.console.pages import add_pages
from eaglenest.api.console.web import Console
from eaglenest.api.edge.registry import Context


def install(app: FastAPI, ctx: Context) -> None:
    """Mount the console's routes on `app` (the catch-all 404 last)."""
    console = Console(ctx)
    app.state.console = console
    add_pages(app, console)
    add_actions(app, console)
    add_fallback(app, console)
