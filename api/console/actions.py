"""The console's actions (POST): sign in, sign out, stop a job, delete an endpoint.

Sign-in checks the pre-session cookie against the form's token (double submit), counts the
attempt against the client address and the access key id (session.AttemptLimiter: 429
past Settings.console_login_attempts_per_minute), then the key pair against the keyring.
Every other action needs a session and its CSRF token in the form, from a same-origin page;
anything else is refused with 403 and changes nothing.

Stopping a job and deleting an endpoint call the SageMaker handlers themselves
(api/sagemaker/optimization_jobs.py, api/sagemaker/endpoints.py) acting for the viewer's
account: the same repository transitions and the same task dispatch as the API's calls.
"""

from __future__ import annotations

import math

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from eaglenest.api.console import session as sessions
from eaglenest.api.console.session import Viewer
from eaglenest.api.console.web import (
    NAME,
    Console,
    read_form,
    redirect,
    safe_next,
    same_origin,
    secure,
    to_login,
)
from eaglenest.api.sagemaker import endpoints, optimization_jobs
from eaglenest.db.repository import find
from eaglenest.db.tables import EndpointRow, OptimizationJobRow
from eaglenest.foundation.errors import ServiceError
from eaglenest.foundation.http.asgi import WholeReply
from eaglenest.foundation.shapes.endpoints import DeleteEndpointInput
from eaglenest.foundation.shapes.optimization_jobs import StopOptimizationJobRequest

FORGED = ("Refused: this request did not come from a page of this console (it has no "
          "valid session or CSRF token). Open the page again and retry from there.")
WRONG_KEY = "The access key ID or the secret access key is wrong."
_TOKEN = 32  # characters of session.new_login_token()


def _login_page(console: Console, request: Request, token: str, nxt: str, status: int = 200,
                error: str = "", key_id: str = "", retry: int = 0) -> WholeReply:
    headers = [sessions.cookie_header(sessions.LOGIN_COOKIE, token,
                                      sessions.LOGIN_COOKIE_SECONDS, secure(request))]
    if retry:
        headers.append((b"retry-after", str(retry).encode()))
    return console.page("login.html", None, status, headers, section="login", token=token,
                        next=nxt, error=error, key_id=key_id)


def _exists(console: Console, viewer: Viewer, table: type, name: str) -> bool:
    if not NAME.match(name):
        return False
    with console.ctx.db.session() as s:
        return find(s, table, name, account_id=viewer.account.account_id) is not None


def _stop_job(console: Console, viewer: Viewer, name: str) -> WholeReply:
    if not _exists(console, viewer, OptimizationJobRow, name):
        return console.not_found(viewer)
    try:
        optimization_jobs.stop_optimization_job(
            console.acting(viewer), StopOptimizationJobRequest(OptimizationJobName=name))
    except ServiceError as exc:
        return console.refused(viewer, exc.message, 409)
    return redirect(f"/console/jobs/{name}")


def _delete_endpoint(console: Console, viewer: Viewer, name: str) -> WholeReply:
    if not _exists(console, viewer, EndpointRow, name):
        return console.not_found(viewer)
    try:
        endpoints.delete_endpoint(console.acting(viewer), DeleteEndpointInput(EndpointName=name))
    except ServiceError as exc:
        return console.refused(viewer, exc.message, 409)
    return redirect("/console/endpoints")


async def checked(console: Console, request: Request) -> Viewer | WholeReply:
    """The viewer of a POST with its session's CSRF token from a same-origin page; else
    the 403 page."""
    viewer = console.viewer(request)
    form = await read_form(request)
    if (viewer is None or form is None or not same_origin(request)
            or not sessions.csrf_ok(viewer.csrf, form.get("csrf"))):
        return console.refused(viewer, FORGED)
    return viewer


def login_form(console: Console, request: Request) -> WholeReply:
    nxt = safe_next(request.query_params.get("next"))
    if console.viewer(request) is not None:
        return redirect(nxt)
    token = request.cookies.get(sessions.LOGIN_COOKIE, "")
    if len(token) != _TOKEN or not token.replace("-", "").replace("_", "").isalnum():
        token = sessions.new_login_token()
    return _login_page(console, request, token, nxt)


async def login(console: Console, request: Request) -> WholeReply:
    form = await read_form(request)
    token = request.cookies.get(sessions.LOGIN_COOKIE, "")
    if form is None or not same_origin(request) or not sessions.csrf_ok(token,
                                                                        form.get("csrf")):
        return console.refused(None, FORGED)
    key_id, nxt = form.get("access_key_id", "").strip(), safe_next(form.get("next"))
    client = request.client.host if request.client else "-"
    wait = console.limiter.attempt([f"address {client}", f"key {key_id[:128]}"])
    if wait is not None:
        retry = max(1, math.ceil(wait))
        return _login_page(console, request, token, nxt, 429, "Too many sign-in attempts: "
                           f"try again in {retry} s.", key_id, retry)
    key = sessions.check_secret(console.keyring.current(), key_id,
                                form.get("secret_access_key", ""))
    if key is None:
        return _login_page(console, request, token, nxt, 401, WRONG_KEY, key_id)
    lifetime = console.settings.console_session_seconds
    cookie, _ = sessions.issue(key, lifetime)
    return redirect(nxt, [
        sessions.cookie_header(sessions.SESSION_COOKIE, cookie, lifetime, secure(request)),
        sessions.cookie_header(sessions.LOGIN_COOKIE, "", 0, secure(request))])


def add_actions(app: FastAPI, console: Console) -> None:
    @app.get("/console/login", include_in_schema=False)
    def sign_in_page(request: Request) -> WholeReply:
        return login_form(console, request)

    @app.post("/console/login", include_in_schema=False)
    async def sign_in(request: Request) -> WholeReply:
        return await login(console, request)

    @app.post("/console/logout", include_in_schema=False)
    async def sign_out(request: Request) -> WholeReply:
        viewer = await checked(console, request)
        if isinstance(viewer, WholeReply):
            return viewer
        return redirect("/console/login", [
            sessions.cookie_header(sessions.SESSION_COOKIE, "", 0, secure(request))])

    @app.post("/console/jobs/{name}/stop", include_in_schema=False)
    async def stop_job(request: Request, name: str) -> WholeReply:
        viewer = await checked(console, request)
        if isinstance(viewer, WholeReply):
            return viewer
        return await run_in_threadpool(_stop_job, console, viewer, name)

    @app.post("/console/endpoints/{name}/delete", include_in_schema=False)
    async def delete_endpoint(request: Request, name: str) -> WholeReply:
        viewer = await checked(console, request)
        if isinstance(viewer, WholeReply):
            return viewer
        return await run_in_threadpool(_delete_endpoint, console, viewer, name)


def add_fallback(app: FastAPI, console: Console) -> None:
    """Any other /console path: the 404 page (signed out, GET: sign in first)."""

    @app.api_route("/console/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"],
                   include_in_schema=False)
    def missing(request: Request, rest: str) -> WholeReply:
        viewer = console.viewer(request)
        if viewer is None and request.method == "GET":
            return to_login(request)
        return console.not_found(viewer)
