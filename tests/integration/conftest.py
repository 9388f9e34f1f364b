"""Real Postgres and Redis servers (Debian packages) for the production-path suite.

`scripts/test.sh` installs `postgresql` and `redis-server`; here each session starts a
throw-away cluster and a Redis on free loopback ports and stops them afterwards. Without
the binaries the suite is skipped on a laptop and fails in CI (CI=true).

`postgres_server` / `redis_server` are the servers themselves, with `stop()` and `start()`
for outage tests (tests/integration/test_outages.py); `postgres_url` / `redis_url` are their
addresses. A test that stops a server must start it again: the servers are shared by the
whole session.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from eaglenest.foundation.host.processes import free_port


def _missing(what: str) -> None:
    msg = f"{what} not installed (scripts/test.sh installs it with apt-get)"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


@dataclass
class Postgres:
    """A throw-away cluster: `initdb` in a temp dir, trust auth, user `eaglenest`."""

    bindir: str
    data: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="eaglenest-pg-"))
    port: int = field(default_factory=free_port)

    def url(self, database: str = "eaglenest") -> str:
        return f"postgresql+psycopg://eaglenest@127.0.0.1:{self.port}/{database}"

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(_as_postgres([f"{self.bindir}/{tool}", *args]), check=check,
                              capture_output=True)

    def init(self) -> None:
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.data, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-D", self.data, "-U", "eaglenest", "--auth=trust", "-E", "UTF8")

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", self.data, "-o", opts, "-w", "-l", f"{self.data}/log", "start")

    def stop(self) -> None:
        """`pg_ctl stop -m fast`: open sessions are cut, the cluster shuts down cleanly."""
        self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", self.data, "status", check=False).returncode == 0

    def create_database(self, name: str) -> str:
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "eaglenest", name)
        return self.url(name)

    def destroy(self) -> None:
        self._run("pg_ctl", "-D", self.data, "-m", "fast", "stop", check=False)
        shutil.rmtree(self.data, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Postgres]:
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins:
        _missing("postgresql")
    pg = Postgres(os.path.dirname(bins[-1]))
    try:
        pg.init()
        pg.start()
        pg.create_database("eaglenest")
        yield pg
    finally:
        pg.destroy()


@pytest.fixture(scope="session")
def postgres_url(postgres_server: Postgres) -> str:
    return postgres_server.url()


@dataclass
class Redis:
    """A `redis-server` without persistence on a fixed port (the same after a restart)."""

    exe: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis(port=self.port).ping():
                    return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Redis]:
    exe = shutil.which("redis-server", path="/usr/bin:/usr/sbin:/usr/local/bin")
    if exe is None:
        _missing("redis-server")
    server = Redis(exe)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: Redis) -> str:
    return redis_server.url
