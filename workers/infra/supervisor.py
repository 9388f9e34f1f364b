"""`eaglenest up`: the embedded broker plus an API and a worker process, supervised.

Contract:
- The banner ("EagleNest is listening on ...") is printed once, after the API answers
  ``/ping``; never while a child is failing to start.
- A child that exits is restarted after a back-off that doubles with each consecutive exit
  (1, 2, 4 ... 30 s) and resets once the child has stayed up for ``HEALTHY_SECONDS``.
- A child that exits within its first ``QUICK_EXIT_SECONDS`` twice in a row did not come up
  (a missing module, a bad setting): `up` prints its last error lines, stops the rest and
  exits 1 instead of restarting it forever.
- The embedded broker is supervised too: if its redis-server dies it is restarted on the
  same port, so the children's broker URL stays valid (queued tasks persist in its AOF).
- SIGINT/SIGTERM stop the worker gracefully first (Celery finishes or re-queues its tasks:
  acks_late), then the API, then the broker.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

from eaglenest.foundation.settings import Settings
from eaglenest.workers.infra.broker import EmbeddedBroker
from eaglenest.workers.infra.credentials import usage

log = logging.getLogger("eaglenest.up")

QUICK_EXIT_SECONDS = 10.0
GIVE_UP_AFTER = 2  # consecutive quick exits
HEALTHY_SECONDS = 60.0
MAX_BACKOFF_SECONDS = 30.0
TAIL_LINES = 20


@dataclass
class Child:
    """One supervised `eaglenest <command>` process and its restart bookkeeping."""

    name: str
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    exits_in_a_row: int = 0
    quick_exits_in_a_row: int = 0
    restart_at: float | None = None
    tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=TAIL_LINES))

    def spawn(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eaglenest.workers.cli", *self.argv], env=self.env,
            stderr=subprocess.PIPE)
        self.started = time.monotonic()
        self.restart_at = None
        threading.Thread(target=self._relay, args=(self.proc,), daemon=True).start()

    def _relay(self, proc: subprocess.Popen[bytes]) -> None:
        """Pass the child's stderr through to ours, keeping its last lines."""
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace")
            self.tail.append(line.rstrip("\n"))
            sys.stderr.write(line)
            sys.stderr.flush()

    def exited(self, now: float) -> bool:
        """Record an exit; True when the child never came up (time to give up)."""
        ran = now - self.started
        if ran >= HEALTHY_SECONDS:
            self.exits_in_a_row = 0
        self.exits_in_a_row += 1
        self.quick_exits_in_a_row = self.quick_exits_in_a_row + 1 if ran < QUICK_EXIT_SECONDS else 0
        if self.quick_exits_in_a_row >= GIVE_UP_AFTER:
            return True
        delay = min(MAX_BACKOFF_SECONDS, 2.0 ** (self.exits_in_a_row - 1))
        self.restart_at = now + delay
        assert self.proc is not None
        log.warning("%s exited with %s after %.1f s; restarting in %.0f s",
                    self.name, self.proc.returncode, ran, delay)
        return False

    def stop(self, timeout: float) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _answers_ping(host: str, port: int) -> bool:
    connect = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    try:
        with urllib.request.urlopen(f"http://{connect}:{port}/ping", timeout=1) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def _give_up(child: Child) -> int:
    assert child.proc is not None
    lines = "\n".join(f"  {line}" for line in list(child.tail)[-TAIL_LINES:]) or "  (no output)"
    print(f"eaglenest up: the {child.name} process exited with code {child.proc.returncode} "
          f"within {QUICK_EXIT_SECONDS:.0f} s of starting, {GIVE_UP_AFTER} times in a row; "
          f"giving up. Its last output:\n{lines}", file=sys.stderr, flush=True)
    return 1


def run_stack(settings: Settings, host: str, port: int) -> int:
    broker: EmbeddedBroker | None = None
    broker_url = settings.broker_url
    if not broker_url:
        broker = EmbeddedBroker(settings.data_dir)
        broker_url = broker.attach_or_start()
    env = {**os.environ, "EAGLENEST_BROKER_URL": broker_url,
           "EAGLENEST_DATA_DIR": str(settings.data_dir.resolve()),
           "EAGLENEST_SUPERVISED": "1"}
    children = [Child("api", ["api", "--host", host, "--port", str(port)], env)]
    if settings.worker_queues.strip():
        children.append(Child("worker", ["worker", "--queues", settings.worker_queues], env))
    stopping = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    for child in children:
        child.spawn()

    def ready() -> bool:
        return _all_running(children) and _answers_ping(host, port)

    try:
        return _supervise(children, broker, stopping, ready,
                          lambda: print(usage(settings, host, port), flush=True))
    finally:
        for child in reversed(children):  # the worker first, then the API
            child.stop(timeout=60 if child.name == "worker" else 15)
        if broker is not None:
            broker.stop()


def _supervise(children: list[Child], broker: EmbeddedBroker | None,
               stopping: threading.Event, ready: Callable[[], bool],
               announce: Callable[[], None]) -> int:
    """Restart what exits until a signal; 1 if a child never comes up."""
    announced = False
    next_check = 0.0
    while not stopping.wait(0.2):
        now = time.monotonic()
        for child in children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.spawn()
            elif child.proc is not None and child.proc.poll() is not None and child.exited(now):
                return _give_up(child)
        if broker is not None and broker.process is not None \
                and broker.process.poll() is not None:
            log.warning("the embedded broker exited with %s; restarting it on port %s",
                        broker.process.returncode, broker.port)
            try:
                broker.start(port=broker.port)
            except RuntimeError as exc:  # e.g. the port is not free yet: try again shortly
                log.error("%s", exc)
                stopping.wait(2)
        if not announced and now >= next_check:
            next_check = now + 0.5
            if ready():
                announce()
                announced = True
    return 0


def _all_running(children: list[Child]) -> bool:
    return all(c.proc is not None and c.proc.poll() is None for c in children)
