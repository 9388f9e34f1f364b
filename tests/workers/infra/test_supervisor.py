"""`eaglenest up` as a supervisor: the banner once the API answers, a child that never comes
up ends `up` with its last error lines, the embedded broker restarted on its port."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

from eaglenest.foundation.host.processes import free_port
from tests.support.stack import Stack

BANNER = "EagleNest is listening on"


def test_banner_once_after_the_api_answers_and_a_clean_stop(tmp_path: Path) -> None:
    stack = Stack(tmp_path).start()
    try:
        deadline = time.monotonic() + 30
        while BANNER not in stack.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        assert stack.log().count(BANNER) == 1, stack.log()[-3000:]
    finally:
        assert stack.proc is not None
        proc = stack.proc
        stack.stop()
    assert proc.returncode == 0, stack.log()[-3000:]


def test_console_shows_the_readme_lines_and_the_log_file_the_rest(tmp_path: Path) -> None:
    """On first start the console shows README.md's lines (`up`'s part of them); Celery's
    banner and library warnings (SecurityWarning, as root) go to <data-dir>/eaglenest.log."""
    port = free_port()
    env = {k: v for k, v in Stack(tmp_path).env().items()
           if k not in ("EAGLENEST_ACCESS_KEY_ID", "EAGLENEST_SECRET_ACCESS_KEY")}
    proc = subprocess.Popen([sys.executable, "-m", "eaglenest.cli", "up", "--port",
                             str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    log = tmp_path / "eaglenest.log"
    try:
        deadline = time.monotonic() + 60
        while not re.search(r"celery\.apps\.worker .* ready", _read(log)):
            assert time.monotonic() < deadline and proc.poll() is None, _read(log)[-3000:]
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        console, _ = proc.communicate(timeout=90)
    url = f"http://127.0.0.1:{port}"
    assert console.splitlines() == [
        f"EagleNest is listening on {url}",
        f"  export AWS_SHARED_CREDENTIALS_FILE={tmp_path}/credentials "
        f"AWS_CONFIG_FILE={tmp_path}/config AWS_PROFILE=eaglenest",
        f"  aws sagemaker list-models --endpoint-url {url}",
        f"  boto3.client('sagemaker', endpoint_url='{url}')"], console
    assert proc.returncode == 0, console
    text = log.read_text()
    assert " -------------- [queues]" in text and "[tasks]" in text  # Celery's banner
    assert text.count(BANNER) == 1
    if os.geteuid() == 0:
        assert "SecurityWarning: You're running the worker with superuser privileges" in text


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_a_child_that_never_comes_up_ends_up_with_its_last_lines(tmp_path: Path) -> None:
    """The API's port is taken: the API exits at once, twice; `up` gives up with exit 1."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = Stack(tmp_path, extra_env={"EAGLENEST_WORKER_QUEUES": ""}).env()
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "eaglenest.cli", "up", "--port", str(port)],
                              env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 1, done.stderr[-3000:]
    assert "the api process exited with code" in done.stderr
    assert "giving up. Its last output:" in done.stderr
    last = done.stderr[done.stderr.index("giving up. Its last output:"):]
    assert "address already in use" in last.lower(), last
    assert f"All of its output: {tmp_path / 'eaglenest.log'}" in last, last
    # the API's error reached the console before `up` gave up, and the log file has it all
    assert "address already in use" in done.stderr[:done.stderr.index("giving up")].lower()
    assert "address already in use" in (tmp_path / "eaglenest.log").read_text().lower()
    assert BANNER not in done.stdout + done.stderr
    assert took < 60, took  # one restart after a 1 s back-off, not a restart loop


def test_the_embedded_broker_is_restarted_on_its_port(tmp_path: Path) -> None:
    stack = Stack(tmp_path, extra_env={"EAGLENEST_WORKER_QUEUES": ""}).start()
    try:
        state = json.loads((tmp_path / "broker.json").read_text())
        os.kill(state["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            now = json.loads((tmp_path / "broker.json").read_text())
            if now["pid"] != state["pid"]:
                break
            time.sleep(0.1)
        assert now["pid"] != state["pid"] and now["port"] == state["port"], now
        password = (tmp_path / "broker.password").read_text().strip()
        assert redis.Redis(host="127.0.0.1", port=now["port"], password=password,
                           socket_timeout=5).ping()
        assert "the embedded broker exited" in stack.log()
        # the API still serves control-plane calls, which publish through the broker
        sm = stack.client()
        sm.list_models()  # type: ignore[attr-defined]
    finally:
        stack.stop()
