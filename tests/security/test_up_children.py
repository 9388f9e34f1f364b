"""`eaglenest up` owns its children for real: SIGKILL of `up` alone takes its API, worker and
broker with it; the next `up` on the data dir starts cleanly (and stops, by record, what a
dead `up` left); a second `up` beside a live one refuses, naming its pid; the banner is
printed only once our own API holds the port."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from tests.support.stack import Stack

BANNER = "EagleNest is listening on"


def _wait_banner(stack: Stack, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while BANNER not in stack.log():
        assert time.monotonic() < deadline, stack.log()[-3000:]
        time.sleep(0.1)


def _gone(pids: list[int], timeout: float = 15) -> list[int]:
    """The pids still running (not zombies) after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def test_sigkill_of_up_takes_its_children_and_the_next_up_starts(tmp_path: Path) -> None:
    first = Stack(tmp_path).start()
    assert first.proc is not None
    _wait_banner(first)
    tree = [p.pid for p in psutil.Process(first.proc.pid).children(recursive=True)]
    names = " ".join(psutil.Process(p).name() for p in tree)
    assert "redis-server" in names and len(tree) >= 3, names  # broker, API, worker
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    assert _gone(tree) == []
    second = Stack(tmp_path, port=first.port).start()
    try:
        _wait_banner(second)
        time.sleep(2)
        assert "address already in use" not in second.log().lower()
        assert second.client().list_models()["Models"] == []
    finally:
        second.stop()


def test_a_second_up_beside_a_live_one_refuses_naming_it(tmp_path: Path) -> None:
    first = Stack(tmp_path).start()
    try:
        assert first.proc is not None
        other = Stack(tmp_path)
        done = subprocess.run([sys.executable, "-m", "eaglenest.cli", "up", "--port",
                               str(other.port)], env=other.env(), capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 1, done.stderr[-2000:]
        assert f"another eaglenest up (pid {first.proc.pid}) runs on data dir" in done.stderr
        assert BANNER not in done.stdout + done.stderr
        assert first.client().list_models()["Models"] == []  # the first one is untouched
    finally:
        first.stop()


class _Ping(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_: object) -> None:
        pass


def test_no_banner_while_another_process_answers_on_the_port(tmp_path: Path) -> None:
    """An old process still answering /ping on the port is not our API listening."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        env = Stack(tmp_path, extra_env={"EAGLENEST_WORKER_QUEUES": ""}).env()
        done = subprocess.run([sys.executable, "-m", "eaglenest.cli", "up", "--port",
                               str(port)], env=env, capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    assert done.returncode == 1, done.stderr[-3000:]
    assert "address already in use" in done.stderr.lower()
    assert BANNER not in done.stdout + done.stderr
