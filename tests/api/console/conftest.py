"""The console's browser tests: Playwright's Python package driving Debian's chromium
(/usr/bin/chromium; Playwright downloads no browser), a second account's key, signing in
through the form, and the screenshots each page leaves in the artifacts folder
($EAGLENEST_ARTIFACTS/console when set, else the session's temporary folder)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.jobs import ROOT
from tests.support.stack import Stack

CHROMIUM = "/usr/bin/chromium"


@dataclass(frozen=True)
class Key:
    access_key: str
    secret: str
    account: str


def create_key(stack: Stack, name: str) -> Key:
    """`eaglenest keys create --new-account`: a key of a second account."""
    env = {**os.environ, "EAGLENEST_DATA_DIR": str(stack.data_dir)}
    r = subprocess.run([sys.executable, "-m", "eaglenest.cli", "keys", "create", "--name", name,
                        "--new-account"], env=env, capture_output=True, text=True, cwd=ROOT,
                       check=False)
    assert r.returncode == 0, r.stderr
    out = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    return Key(out["access key id"], out["secret access key"], out["account"])


def revoke_key(stack: Stack, key: str) -> None:
    env = {**os.environ, "EAGLENEST_DATA_DIR": str(stack.data_dir)}
    r = subprocess.run([sys.executable, "-m", "eaglenest.cli", "keys", "revoke", key], env=env,
                       capture_output=True, text=True, cwd=ROOT, check=False)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="package")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """An API without a worker (nothing runs), shared by the tests that run no job."""
    # the modules here sign in from one address more often than the default 5 a minute
    # allows; the limit itself is tested on an API of its own (test_sign_in.py)
    s = Stack(tmp_path_factory.mktemp("console-api"),
              extra_env={"EAGLENEST_WORKER_QUEUES": "",
                         "EAGLENEST_CONSOLE_LOGIN_ATTEMPTS_PER_MINUTE": "1000"}).start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = os.environ.get("EAGLENEST_ARTIFACTS")
    path = Path(base) / "console" if base else tmp_path_factory.mktemp("console-screens")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Chromium for this folder only: Playwright's sync API keeps an event loop running on
    the main thread while it is open, and later tests call asyncio.run()."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package "
                    "(scripts/test.sh does); Playwright's own browser is never downloaded")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield b
        b.close()


def sign_in(browser: Any, stack: Stack, key: str, secret: str, start: str = "/console/jobs"
            ) -> Any:
    """A new browser context signed in through the sign-in form; its page, on `start`."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(stack.url + start)
    assert "/console/login" in page.url, page.url  # signed out: sent to sign in first
    page.fill("#access_key_id", key)
    page.fill("#secret_access_key", secret)
    with page.expect_navigation():
        page.click("#sign-in")
    assert page.url == stack.url + start, page.content()[:2000]
    return page


def shot(page: Any, artifacts: Path, name: str) -> Path:
    path = artifacts / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def page_cost(url: str, cookies: dict[str, str], paths: list[str], out: Path,
              views: int = 50) -> dict[str, dict[str, float]]:
    """What a view of each page costs the API: `views` GETs of it over one kept-alive
    connection after 5 to warm up, timed by the client on loopback (/ping, the floor every
    request pays, first). Written to `out` as JSON."""
    cost: dict[str, dict[str, float]] = {}
    with httpx.Client(base_url=url, cookies=cookies) as c:
        for path in ["/ping", *paths]:
            times = []
            for i in range(views + 5):
                t = time.perf_counter()
                r = c.get(path)
                if i >= 5:
                    times.append(1000 * (time.perf_counter() - t))
                assert r.status_code == 200, (path, r.status_code)
            times.sort()
            cost[path] = {"mean_ms": round(statistics.fmean(times), 2),
                          "p50_ms": round(times[len(times) // 2], 2),
                          "p95_ms": round(times[int(len(times) * 0.95) - 1], 2),
                          "bytes": len(r.content)}
    out.write_text(json.dumps(cost, indent=1))
    return cost
