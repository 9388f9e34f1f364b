"""Signing in to the console (api/console/actions.py, session.py) against a real API (the
package's `api` stack: no worker, nothing runs a job): the cookies' attributes and the
pages' security headers, a wrong secret, a sign-in form posted without its token, a forged
session and a revoked key, and the rate limit on sign-in attempts (on an API of its own, with a limit of 2: it
locks this client address out of that API for a minute)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from tests.api.console.conftest import create_key, revoke_key, shot, sign_in
from tests.support.stack import ACCESS_KEY, SECRET_KEY, Stack


def _form(client: httpx.Client) -> str:
    """GET the sign-in page: its form's token (the pre-session cookie is now set)."""
    r = client.get("/console/login")
    assert r.status_code == 200
    match = re.search(r'name="csrf" value="([^"]+)"', r.text)
    assert match
    return match[1]


def _post(client: httpx.Client, token: str | None, key: str, secret: str) -> httpx.Response:
    data = {"access_key_id": key, "secret_access_key": secret, "next": "/console/models"}
    if token is not None:
        data["csrf"] = token
    return client.post("/console/login", data=data)


def _cookie(r: httpx.Response, name: str) -> str:
    found = [c for c in r.headers.get_list("set-cookie") if c.startswith(name + "=")]
    assert len(found) == 1, r.headers.get_list("set-cookie")
    return found[0]


def test_cookies_and_security_headers(api: Stack) -> None:
    with httpx.Client(base_url=api.url) as c:
        assert c.get("/console/models").headers["location"] == \
            "/console/login?next=/console/models"
        token = _form(c)
        r = _post(c, token, ACCESS_KEY, SECRET_KEY)
        assert r.status_code == 303 and r.headers["location"] == "/console/models"
        cookie = _cookie(r, "eaglenest_console")
        assert "; Path=/console; Max-Age=28800; HttpOnly; SameSite=Strict" in cookie
        assert "Secure" not in cookie  # plain http here; https adds it
        page = c.get("/console/models")
        assert page.status_code == 200
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        assert "frame-ancestors 'none'" in csp and "'unsafe-inline'" not in csp
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["cache-control"] == "no-store"
        assert page.headers["x-content-type-options"] == "nosniff"
        # nothing on the page comes from elsewhere: one stylesheet and one script, ours
        assert re.findall(r'(?:src|href)="([^"]+)"', page.text.split("<body>")[0]) == [
            "/console/static/console.css", "/console/static/live.js"]
        assert c.get("/console/static/live.js").headers["content-type"].startswith(
            "text/javascript")
        assert c.get("/console/static/../web.py").status_code == 404


def test_wrong_secret_is_refused(api: Stack, browser, artifacts) -> None:
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.goto(api.url + "/console/login")
    shot(page, artifacts, "login")
    page.fill("#access_key_id", ACCESS_KEY)
    page.fill("#secret_access_key", SECRET_KEY + "x")
    with page.expect_response(lambda r: r.url.endswith("/console/login")
                              and r.request.method == "POST") as answer:
        page.click("#sign-in")
    assert answer.value.status == 401
    assert page.inner_text("#login-error") == \
        "The access key ID or the secret access key is wrong."
    assert not [c for c in page.context.cookies() if c["name"] == "eaglenest_console"]
    shot(page, artifacts, "login-wrong-secret")
    page.goto(api.url + "/console/jobs")
    assert "/console/login" in page.url
    page.context.close()


def test_sign_in_form_without_its_token_is_refused(api: Stack) -> None:
    with httpx.Client(base_url=api.url) as c:
        _form(c)
        r = _post(c, None, ACCESS_KEY, SECRET_KEY)
        assert r.status_code == 403
        assert "did not come from a page of this console" in r.text
        assert "eaglenest_console=" not in " ".join(r.headers.get_list("set-cookie"))
    with httpx.Client(base_url=api.url) as c:  # a token without its cookie
        r = _post(c, "a" * 32, ACCESS_KEY, SECRET_KEY)
        assert r.status_code == 403


def test_forged_session_and_revoked_key_end_the_session(api: Stack, browser) -> None:
    key = create_key(api, "console-revoked")
    page = sign_in(browser, api, key.access_key, key.secret)
    context = page.context
    cookie = next(c for c in context.cookies() if c["name"] == "eaglenest_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/console"
    assert page.inner_text("#account") == key.account
    with httpx.Client(base_url=api.url) as c:
        forged = cookie["value"][:-1] + ("0" if cookie["value"][-1] != "0" else "1")
        c.cookies.set("eaglenest_console", forged, path="/console")
        assert c.get("/console/jobs").status_code == 303
    revoke_key(api, key.access_key)
    page.goto(api.url + "/console/models")
    assert "/console/login" in page.url  # the key is gone: so is its session
    context.close()


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """An API of its own: the limit test locks 127.0.0.1 out of it for a minute."""
    s = Stack(tmp_path_factory.mktemp("console-limited"), extra_env={
        "EAGLENEST_WORKER_QUEUES": "", "EAGLENEST_CONSOLE_LOGIN_ATTEMPTS_PER_MINUTE": "2"}
              ).start()
    yield s
    s.stop()


def test_sign_in_attempts_are_rate_limited(limited: Stack) -> None:
    with httpx.Client(base_url=limited.url) as c:
        token = _form(c)
        codes = [_post(c, token, ACCESS_KEY, "wrong-secret").status_code for _ in range(3)]
        assert codes == [401, 401, 429]
        r = _post(c, token, ACCESS_KEY, SECRET_KEY)  # even the right secret, for now
        assert r.status_code == 429
        assert 1 <= int(r.headers["retry-after"]) <= 60
        assert re.search(r"Too many sign-in attempts: try again in \d+ s\.", r.text)
        assert "eaglenest_console=" not in " ".join(r.headers.get_list("set-cookie"))
