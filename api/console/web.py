"""What every console route shares: the `Console` (settings, keyring, sign-in limiter,
templates), who the request is (`viewer`), replies with the console's security headers,
and the small form reader.

Every reply carries a strict Content-Security-Policy (only this origin's script, style and
fetches; no frames, no plugins, no base URI), X-Frame-Options DENY, nosniff and no
referrer beyond the origin; every page is `no-store` (they show the account's resources).
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.requests import Request

from eaglenest.api.console import session as sessions
from eaglenest.api.console.session import Viewer
from eaglenest.api.edge.keyring import KeyRing
from eaglenest.api.edge.registry import Context
from eaglenest.foundation.http.asgi import WholeReply

HERE = Path(__file__).resolve().parent
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
NO_STORE = (b"cache-control", b"no-store")
HTML = b"text/html; charset=utf-8"
#: the static files the pages use, and their types (served from static/)
STATIC = {"console.css": b"text/css; charset=utf-8",
          "live.js": b"text/javascript; charset=utf-8"}
#: where a sign-in may send the browser on: a console page, nothing else
_NEXT = re.compile(r"^/console(/[A-Za-z0-9._~-]+)*$")
#: resource names as SageMaker allows them; anything else names nothing
NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
MAX_FORM_BYTES = 8192
Headers = list[tuple[bytes, bytes]]


def when(t: float | None) -> str:
    """An epoch time as the pages show it (UTC)."""
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(t)))


def templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["when"] = when
    return env


def safe_next(target: str | None) -> str:
    return target if target and _NEXT.match(target) else "/console/jobs"


class Console:
    """The console's state, built once per app in `install` (nothing at import time)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx, self.settings = ctx, ctx.settings
        self.keyring = KeyRing(ctx.settings)
        self.limiter = sessions.AttemptLimiter(ctx.settings.console_login_attempts_per_minute)
        self.env = templates()
        self.static = {name: (HERE / "static" / name).read_bytes() for name in STATIC}

    def viewer(self, request: Request) -> Viewer | None:
        return sessions.verify(request.cookies.get(sessions.SESSION_COOKIE),
                               self.keyring.current(), self.settings.region)

    def acting(self, viewer: Viewer) -> Context:
        """The API's context acting for the viewer's account (as a signed request's)."""
        return replace(self.ctx, account=viewer.account)

    def page(self, template: str, viewer: Viewer | None, status: int = 200,
             headers: Headers | None = None, **values: Any) -> WholeReply:
        body = self.env.get_template(template).render(viewer=viewer, **values).encode()
        return WholeReply(status, body, HTML,
                          [*SECURITY_HEADERS, NO_STORE, *(headers or [])])

    def not_found(self, viewer: Viewer | None) -> WholeReply:
        """The one answer for a name that is missing and for another account's."""
        return self.page("not_found.html", viewer, 404, section="")

    def refused(self, viewer: Viewer | None, message: str, status: int = 403) -> WholeReply:
        return self.page("refused.html", viewer, status, section="", message=message)

    def static_file(self, name: str) -> WholeReply | None:
        if name not in STATIC:
            return None
        return WholeReply(200, self.static[name], STATIC[name],
                          [*SECURITY_HEADERS, (b"cache-control", b"private, max-age=300")])


def redirect(location: str, headers: Headers | None = None) -> WholeReply:
    return WholeReply(303, b"", HTML, [*SECURITY_HEADERS, NO_STORE,
                                        (b"location", location.encode()), *(headers or [])])


def to_login(request: Request) -> WholeReply:
    """A signed-out browser's way to the page it asked for."""
    return redirect("/console/login?next=" + quote(safe_next(request.url.path), safe="/"))


def secure(request: Request) -> bool:
    return request.url.scheme == "https"


def same_origin(request: Request) -> bool:
    """False when the browser says the request came from another site (Sec-Fetch-Site) or
    names another origin (Origin); a request that says neither is judged by its token."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return origin.split("://", 1)[-1] == request.headers.get("host", "")


async def read_form(request: Request) -> dict[str, str] | None:
    """An urlencoded form's fields (each field's first value); None when the body is not
    one or is larger than MAX_FORM_BYTES."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=16)
    except (UnicodeDecodeError, ValueError):
        return None
    return {k: v[0] for k, v in fields.items()}
