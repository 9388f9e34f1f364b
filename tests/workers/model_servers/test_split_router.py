"""Split serving (workers/model_servers/split_router.py): the policy on its own, then the router as a
process over two stand-in model servers (tests/support/fake_model_server.py): which server
each request reaches under load, relayed bodies and streams, the instance's secret, and
that no model server outlives the router or runs on without its sibling."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from eaglenest.foundation.host.processes import free_port
from eaglenest.foundation.http import instance_auth
from eaglenest.workers.model_servers.split_router import (
    PLAIN,
    SPEC,
    WARM_UP_BATCH,
    SplitPolicy,
    with_port,
)
from tests.support.processes import process_group_alive, wait_group_gone

ROOT = Path(__file__).resolve().parents[3]
SECRET = "s3cr3t"
AUTH = {"Authorization": f"Bearer {SECRET}"}


def test_the_policy_speculates_up_to_the_threshold_and_follows_the_plain_server():
    p = SplitPolicy(speculate_upto=2)
    assert [p.choose(), p.choose(), p.choose()] == [SPEC, SPEC, PLAIN]
    p.done(SPEC)
    assert p.choose() == PLAIN  # the plain server serves: new requests follow it
    p.done(SPEC)
    assert p.choose() == PLAIN
    p.done(PLAIN)
    p.done(PLAIN)
    assert (p.spec, p.plain) == (0, 1)
    p.done(PLAIN)
    assert [p.choose(), p.choose(), p.choose()] == [SPEC, SPEC, PLAIN]  # drained: speculate


def test_a_burst_at_an_idle_router_goes_to_one_server():
    async def burst(n: int, policy: SplitPolicy) -> list[str]:
        return list(await asyncio.gather(*(policy.admit() for _ in range(n))))

    p = SplitPolicy(speculate_upto=2, burst_s=0.05)
    assert asyncio.run(burst(3, p)) == [PLAIN] * 3  # without the window: SPEC, SPEC, PLAIN
    for _ in range(3):
        p.done(PLAIN)
    assert asyncio.run(burst(2, p)) == [SPEC] * 2
    start = time.monotonic()
    assert asyncio.run(burst(1, p)) == [PLAIN]  # not idle: no window, the usual rule
    assert time.monotonic() - start < 0.04


def test_with_port_replaces_or_appends_the_port():
    assert with_port(["x", "--port", "1", "--y"], 7) == ["x", "--port", "7", "--y"]
    assert with_port(["x"], 7) == ["x", "--port", "7"]


def _fake(name: str, *extra: str) -> str:
    return json.dumps([sys.executable, "-m", "tests.support.fake_model_server", "--name", name,
                       "--port", "0", *extra])


@pytest.fixture
def router(request):  # type: ignore[no-untyped-def]
    extra = getattr(request, "param", {})
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "eaglenest.workers.model_servers.split_router", "--port", str(port),
         "--speculate-upto", "2", "--speculative-command", _fake(SPEC, *extra.get(SPEC, [])),
         "--plain-command", _fake(PLAIN)],
        cwd=ROOT, env={**os.environ, instance_auth.SECRET_ENV: SECRET},
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not instance_auth.probe(url, SECRET, timeout=1):
        assert proc.poll() is None and time.monotonic() < deadline, "router not healthy"
        time.sleep(0.2)
    yield url, proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _post(url: str, delay: float = 0.0, **body: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"delay": delay, **body}, headers=AUTH,
                      timeout=30)


def test_requests_above_the_threshold_go_to_the_plain_server(router):
    url, _ = router
    # healthy means warm: each server answered a warm-up burst, not counted as routed
    assert f"fake_completions_total {WARM_UP_BATCH}" in httpx.get(f"{url}/metrics", headers=AUTH).text
    with ThreadPoolExecutor(3) as pool:
        first = [pool.submit(_post, url, 1.5) for _ in range(2)]
        time.sleep(0.5)  # both in flight
        third = pool.submit(_post, url, 0.2)
        assert third.result().json()["server"] == PLAIN
        time.sleep(0.3)  # the plain server has drained; 2 still in flight: plain
        assert _post(url).json()["server"] == PLAIN
        assert [f.result().json()["server"] for f in first] == [SPEC, SPEC]
    deadline = time.monotonic() + 10  # a request is done just after its reply's last byte
    while 'split_running{server="speculative"} 0' not in httpx.get(
            f"{url}/metrics", headers=AUTH).text:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    reply = _post(url, 0, prompt="hi", max_tokens=3)
    assert reply.status_code == 200
    assert reply.json() == {"server": SPEC, "body": {"delay": 0, "prompt": "hi",
                                                    "max_tokens": 3}}
    page = httpx.get(f"{url}/metrics", headers=AUTH).text
    assert 'fake_server_name{name="speculative"} 1' in page  # the speculating server's page
    assert f"fake_completions_total {WARM_UP_BATCH + 3}" in page  # + 2 of the burst, the last
    assert 'eaglenest:split_requests_total{server="speculative"} 3' in page
    assert 'eaglenest:split_requests_total{server="plain"} 2' in page
    # the first two arrived together at an idle router (the last one may find it idle too:
    # the router counts a request done just after its reply's last byte)
    bursts = page.split('split_burst_requests_total{server="speculative"} ', 1)[1]
    assert int(bursts.split()[0]) in (2, 3)


def test_streams_are_relayed_event_by_event(router):
    url, _ = router
    seen = []
    with httpx.stream("POST", f"{url}/v1/completions", json={"stream": True}, headers=AUTH,
                      timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen.append((time.monotonic(), line[6:]))
    assert [p for _, p in seen][-1] == "[DONE]"
    assert [json.loads(p)["i"] for _, p in seen[:-1]] == [0, 1, 2]
    assert seen[2][0] - seen[0][0] > 0.15  # arrived as sent, not at the end


def test_the_instance_secret_is_required(router):
    url, _ = router
    r = httpx.post(f"{url}/v1/completions", json={}, timeout=10)
    assert r.status_code == 401
    assert "instance key" in r.json()["message"]
    assert not instance_auth.probe(url, "another secret")


def test_sigterm_stops_both_model_servers(router):
    _, proc = router
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 0
    wait_group_gone(proc.pid, 30)


EXIT_FLAG = Path(f"/tmp/eaglenest-split-test-{os.getpid()}")


@pytest.mark.parametrize("router", [{SPEC: ["--exit-on", str(EXIT_FLAG)]}], indirect=True)
def test_a_model_server_that_exits_takes_the_router_and_its_sibling_down(router):
    url, proc = router
    EXIT_FLAG.touch()
    try:
        assert proc.wait(30) == 1
    finally:
        EXIT_FLAG.unlink()
    wait_group_gone(proc.pid, 30)
    assert not process_group_alive(proc.pid)
