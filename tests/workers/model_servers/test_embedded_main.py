"""The embedded server's process: the engine on the main thread, HTTP on another
(workers/model_servers/embedded/__main__.py `serve`), the one-at-a-time engine path, and how the
process ends (a signal: 0 after in-flight work; a port in use: 1)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from eaglenest.foundation.host.processes import free_port
from eaglenest.workers.model_servers.embedded.__main__ import serve
from eaglenest.workers.model_servers.embedded.metrics import parse_steps_by_decoding
from tests.workers.model_servers.test_embedded_server import completion_text

PROMPTS = ["Natalia sold 48 clips", "def add(a, b):", "The quick brown fox"]


class _Runner:
    """Stands in for generation.Runner: records the thread `serve` runs on."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.stopped = threading.Event()

    def serve(self) -> None:
        self.thread = threading.current_thread()
        assert self.stopped.wait(30), "stop() never came"

    def stop(self) -> None:
        self.stopped.set()


def _web(port: int, seen: list[str]) -> uvicorn.Server:
    app = FastAPI()

    @app.get("/health")
    async def health() -> str:
        seen.append(threading.current_thread().name)
        return "ok"

    return uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))


def _in_a_while(fn, until) -> threading.Thread:  # type: ignore[no-untyped-def]
    def go() -> None:
        deadline = time.monotonic() + 30
        while not until() and time.monotonic() < deadline:
            time.sleep(0.05)
        fn()
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_engine_on_the_calling_thread_http_on_another_and_sigterm_ends_both():
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    runner, seen, port = _Runner(), list[str](), free_port()
    web = _web(port, seen)

    def probe_then_term() -> None:
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        _in_a_while(probe_then_term, lambda: web.started)
        assert serve(runner, web) == 0
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert runner.thread is threading.main_thread()
    assert runner.stopped.is_set()
    assert seen == ["http"]  # the request was answered on the HTTP thread


def test_port_in_use_returns_1_and_stops_the_engine():
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        runner = _Runner()
        try:
            assert serve(runner, _web(taken.getsockname()[1], [])) == 1
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
    assert runner.stopped.is_set()


def _wait_healthy(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server exited"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("no /health in 120 s")


@pytest.fixture()
def one_at_a_time(tmp_path: Path, tiny_llama_dir, tiny_eagle3_dir) -> Iterator[tuple]:
    """An embedded server with --max-num-seqs 1 (the batch-1 engine path), scheduled: it
    runs the entry at 1 running, a depth-3 tree."""
    port = free_port()
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "eaglenest.workers.model_servers.embedded", "--model",
         str(tiny_llama_dir), "--head", str(tiny_eagle3_dir), "--num-speculative-tokens", "3",
         "--max-num-seqs", "1", "--port", str(port), "--served-model-name", "tiny",
         "--max-model-len", "256", "--speculation-schedule", '[[1,3,"tree"],[8,2,"chain"]]'],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log.close()


def _text(url: str, prompt: str, n: int) -> str:
    r = httpx.post(f"{url}/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_one_at_a_time_server_serves_concurrent_clients_and_ends_on_sigterm(one_at_a_time):
    url, proc = one_at_a_time
    want = [_text(url, p, 12) for p in PROMPTS]
    assert all(want)

    async def together() -> list[str]:
        async with httpx.AsyncClient(timeout=120) as client:
            return list(await asyncio.gather(*[completion_text(client, url, p, 12, i % 2 == 0)
                                               for i, p in enumerate(PROMPTS)]))

    assert asyncio.run(together()) == want
    steps = parse_steps_by_decoding(httpx.get(f"{url}/metrics").text)
    assert set(steps) == {"tree"} and steps["tree"] > 0, steps  # the entry at 1 only
    # a client that leaves mid-stream does not hold the engine: the next request is answered
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 200, "temperature": 0,
            "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        next(r.iter_lines())
    assert _text(url, PROMPTS[1], 12) == want[1]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
