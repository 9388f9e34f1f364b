"""`eaglenest up`: the embedded broker plus an API and a worker process, supervised.

A child that dies is restarted (with a short back-off); SIGINT/SIGTERM stop the worker
gracefully first (Celery finishes or re-queues its tasks: acks_late), then the API, then
the broker.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from types import FrameType

from api.settings import Settings
from workers.broker import EmbeddedBroker
from workers.credentials import usage

log = logging.getLogger("eaglenest.up")


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "workers.cli", *args], env=env)


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_stack(settings: Settings, host: str, port: int) -> int:
    broker: EmbeddedBroker | None = None
    broker_url = settings.broker_url
    if not broker_url:
        broker = EmbeddedBroker(settings.data_dir)
        broker_url = broker.attach_or_start()
    env = {**os.environ, "EAGLENEST_BROKER_URL": broker_url,
           "EAGLENEST_DATA_DIR": str(settings.data_dir.resolve())}
    children = {"api": ["api", "--host", host, "--port", str(port)]}
    if settings.worker_queues.strip():
        children["worker"] = ["worker", "--queues", settings.worker_queues]
    procs = {name: _spawn(cmd, env) for name, cmd in children.items()}
    stopping = False

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    log.info("%s", usage(settings, host, port).replace("\n", " | "))
    try:
        while not stopping:
            time.sleep(0.2)
            for name, proc in procs.items():
                if proc.poll() is not None and not stopping:
                    log.warning("%s exited with %s; restarting", name, proc.returncode)
                    time.sleep(1)
                    procs[name] = _spawn(children[name], env)
    finally:
        if "worker" in procs:
            _stop(procs["worker"], timeout=60)
        _stop(procs["api"], timeout=15)
        if broker is not None:
            broker.stop()
    return 0
