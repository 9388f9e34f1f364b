"""The console's pages (GET): models, jobs, a job, endpoints, an endpoint, hosts, and the
static files they use. A signed-out browser is sent to the sign-in page first; a name the
viewer's account does not have gets the same 404 page whether it is missing or another
account's. Pages with live figures set `refresh` (seconds): static/live.js fetches the
page again that often and swaps its live parts in place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from sqlalchemy.orm import Session
from starlette.requests import Request

from eaglenest.api.console import views
from eaglenest.api.console.session import Viewer
from eaglenest.api.console.web import NAME, Console, redirect, to_login
from eaglenest.foundation.http.asgi import WholeReply

#: seconds between a page's refreshes: a running job's, and every other live page's
JOB_REFRESH, REFRESH = 2, 5


Read = Callable[[Session, Viewer, str], dict[str, Any] | None]


def _job(s: Session, v: Viewer, name: str) -> dict[str, Any] | None:
    found = views.job(s, v.account, name) if NAME.match(name) else None
    return {"job": found} if found else None


def _endpoint(s: Session, v: Viewer, name: str) -> dict[str, Any] | None:
    found = views.endpoint(s, v.account, name) if NAME.match(name) else None
    return {"endpoint": found} if found else None


def _brief(s: Session, v: Viewer, name: str) -> dict[str, Any] | None:
    found = views.endpoint_brief(s, v.account, name) if NAME.match(name) else None
    return {"endpoint": found} if found else None


def _pages(lease_seconds: float) -> list[tuple[str, str, str, int, Read]]:
    """(path, template, section, refresh seconds, what it reads) of each page."""
    return [
        ("/console/models", "models.html", "models", REFRESH,
         lambda s, v, _: views.models(s, v.account)),
        ("/console/jobs", "jobs.html", "jobs", REFRESH, lambda s, v, _: views.jobs(s, v.account)),
        ("/console/jobs/{name}", "job.html", "jobs", JOB_REFRESH, _job),
        ("/console/endpoints", "endpoints.html", "endpoints", REFRESH,
         lambda s, v, _: views.endpoints(s, v.account)),
        ("/console/endpoints/{name}", "endpoint.html", "endpoints", REFRESH, _endpoint),
        ("/console/endpoints/{name}/delete", "confirm_delete.html", "endpoints", 0, _brief),
        ("/console/hosts", "hosts.html", "hosts", REFRESH,
         lambda s, v, _: views.hosts(s, v.account, lease_seconds)),
    ]


def _page(console: Console, template: str, section: str, refresh: int, read: Read
          ) -> Callable[[Request], WholeReply]:
    def show(request: Request) -> WholeReply:
        viewer = console.viewer(request)
        if viewer is None:
            return to_login(request)
        name = str(request.path_params.get("name", ""))
        with console.ctx.db.session() as s:
            values = read(s, viewer, name)
        if values is None:
            return console.not_found(viewer)
        return console.page(template, viewer, section=section, refresh=refresh, **values)

    return show


def add_pages(app: FastAPI, console: Console) -> None:
    for path, template, section, refresh, read in _pages(console.settings.job_lease_seconds):
        app.add_api_route(path, _page(console, template, section, refresh, read),
                          methods=["GET"], include_in_schema=False)

    @app.get("/console", include_in_schema=False)
    def home() -> WholeReply:
        return redirect("/console/jobs")

    @app.get("/console/static/{file}", include_in_schema=False)
    def static(request: Request, file: str) -> WholeReply:
        found = console.static_file(file)
        return found if found is not None else console.not_found(console.viewer(request))
