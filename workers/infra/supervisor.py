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
- Every child (API, worker, broker) is an owned child (foundation/host/children.py): it dies with
  `up`, SIGKILL included, and is recorded in `<data-dir>/up/` until it stops. An `up` that
  starts on a data dir first stops, by record, what a dead `up` left there; while another
  `up` of that data dir is alive it refuses (exit 1, naming its pid and its children's).
- "Listening" means the API child itself holds the port (checked in /proc): an old process
  that answers /ping on it does not count.
- The children's stdout and stderr go to `<data-dir>/eaglenest.log`, their errors to the
  console too; the console shows the banner, `up`'s warnings and its errors
  (workers/infra/console.py).
"""

from __future__ import annotations

import collections
import contextlib
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
from pathlib import Path
from types import FrameType

from eaglenest.foundation.host import children
from eaglenest.foundation.settings import Settings
from eaglenest.workers.infra.broker import EmbeddedBroker
from eaglenest.workers.infra.console import ErrorLines, UpLog, attach
from eaglenest.workers.infra.credentials import usage

log = logging.getLogger("eaglenest.up")

QUICK_EXIT_SECONDS = 10.0
GIVE_UP_AFTER = 2  # consecutive quick exits
HEALTHY_SECONDS = 60.0
MAX_BACKOFF_SECONDS = 30.0
TAIL_LINES = 20
#: `<data-dir>/up/`: the records of `up`'s own children (foundation/host/children.py)
UP_RECORDS = "up"


@dataclass
class Child:
    """One supervised `eaglenest <command>` process and its restart bookkeeping."""

    name: str
    argv: list[str]
    env: dict[str, str]
    children_dir: Path | None = None
    #: where its output goes (None: all of it to our stderr)
    up_log: UpLog | None = None
    proc: subprocess.Popen[bytes] | None = None
    record: children.ChildRecord | None = None
    started: float = 0.0
    exits_in_a_row: int = 0
    quick_exits_in_a_row: int = 0
    restart_at: float | None = None
    tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=TAIL_LINES))

    def spawn(self) -> None:
        self._forget()
        self.proc, self.record = children.spawn(
            [sys.executable, "-m", "eaglenest.cli", *self.argv], role=f"up-{self.name}",
            resource="up", children_dir=self.children_dir, env=self.env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT)
        self.started = time.monotonic()
        self.restart_at = None
        threading.Thread(target=self._relay, args=(self.proc,), daemon=True).start()

    def _relay(self, proc: subprocess.Popen[bytes]) -> None:
        """Pass the child's output to the log file and its errors to our stderr (without a
        log file, all of it to our stderr), keeping its last lines. A line a stream
        refuses (closed, full disk) is dropped, never the thread: a relay that died would
        leave the child blocked on a full pipe."""
        assert proc.stdout is not None
        errors = ErrorLines()
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            self.tail.append(line.rstrip("\n"))
            try:
                if self.up_log is not None:
                    self.up_log.write(line)
                if self.up_log is None or errors.shows(line):
                    sys.stderr.write(line)
                    sys.stderr.flush()
            except (OSError, ValueError):  # ValueError: a stream was closed
                continue

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
        log.warning("%s exited with %s after %.1f s; restarting in %.0f s%s",
                    self.name, self.proc.returncode, ran, delay, self.see_log())
        return False

    def see_log(self) -> str:
        """` (its output: <log file>)`, or "" without a log file."""
        return f" (its output: {self.up_log.path})" if self.up_log is not None else ""

    def _forget(self) -> None:
        if self.record is not None:
            children.forget(self.children_dir, self.record)
            self.record = None

    def stop(self, timeout: float) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            self._forget()
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self._forget()


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
    text = (f"eaglenest up: the {child.name} process exited with code {child.proc.returncode} "
            f"within {QUICK_EXIT_SECONDS:.0f} s of starting, {GIVE_UP_AFTER} times in a row; "
            f"giving up. Its last output:\n{lines}")
    if child.up_log is not None:
        child.up_log.say(f"{text}\nAll of its output: {child.up_log.path}", sys.stderr)
    else:
        print(text, file=sys.stderr, flush=True)
    return 1


def claim_data_dir(children_dir: Path) -> str | None:
    """Stop what a dead `up` of this data dir left running (by its records); why this `up`
    may not start (another one is alive), else None."""
    for record in children.reap(children_dir):
        log.warning("stopped %s (pid %d) left by an earlier eaglenest up", record.role,
                    record.pid)
    live = [r for r in children.records(children_dir) if r.owner is not None and r.owner.alive()]
    if not live:
        return None
    owners = sorted({r.owner.pid for r in live if r.owner is not None})
    pids = ", ".join(f"{r.role} {r.pid}" for r in live)
    return (f"eaglenest up: another eaglenest up (pid {', '.join(map(str, owners))}) runs on "
            f"data dir {children_dir.parent} ({pids}); stop it first")


def run_stack(settings: Settings, host: str, port: int) -> int:
    """Run the stack until a signal (0) or a child that never comes up (1); its output goes
    to the data dir's log file (workers/infra/console.py)."""
    up_log = attach(settings)
    try:
        return _run_stack(settings, host, port, up_log)
    finally:
        up_log.close()


def _run_stack(settings: Settings, host: str, port: int, up_log: UpLog) -> int:
    children_dir = settings.data_dir / UP_RECORDS
    refused = claim_data_dir(children_dir)
    if refused:
        up_log.say(refused, sys.stderr)
        return 1
    broker: EmbeddedBroker | None = None
    broker_url = settings.broker_url
    if not broker_url:
        broker = EmbeddedBroker(settings.data_dir, children_dir=children_dir)
        broker_url = broker.attach_or_start()
    env = {**os.environ, "EAGLENEST_BROKER_URL": broker_url,
           "EAGLENEST_DATA_DIR": str(settings.data_dir.resolve()),
           "EAGLENEST_SUPERVISED": "1", "PYTHONUNBUFFERED": "1"}  # lines reach the log as written
    procs = [Child("api", ["api", "--host", host, "--port", str(port)], env, children_dir, up_log)]
    if settings.worker_queues.strip():
        procs.append(Child("worker", ["worker", "--queues", settings.worker_queues], env,
                           children_dir, up_log))
    stopping = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    for child in procs:
        child.spawn()

    def ready() -> bool:
        api = procs[0].proc
        return (_all_running(procs) and _answers_ping(host, port)
                and api is not None and holds_port(api.pid, port))

    try:
        return _supervise(procs, broker, stopping, ready,
                          lambda: up_log.say(usage(settings, host, port)))
    finally:
        for child in reversed(procs):  # the worker first, then the API
            child.stop(timeout=60 if child.name == "worker" else 15)
        if broker is not None:
            broker.stop()


def _supervise(procs: list[Child], broker: EmbeddedBroker | None,
               stopping: threading.Event, ready: Callable[[], bool],
               announce: Callable[[], None]) -> int:
    """Restart what exits until a signal; 1 if a child never comes up."""
    announced = False
    next_check = 0.0
    while not stopping.wait(0.2):
        now = time.monotonic()
        for child in procs:
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


def holds_port(pid: int, port: int) -> bool:
    """Whether process `pid` has a socket listening on TCP `port` (Linux /proc; True where
    /proc/net cannot be read, as before this check existed)."""
    inodes = set()
    try:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")  # 0A: LISTEN
    except (OSError, IndexError, ValueError):
        return True
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
    return False


def _all_running(procs: list[Child]) -> bool:
    return all(c.proc is not None and c.proc.poll() is None for c in procs)
