"""Real Postgres and Redis servers (Debian packages) for the production-path suite.

`scripts/test.sh` installs `postgresql` and `redis-server`; here each session starts a
throw-away cluster and a Redis on free loopback ports and stops them afterwards. Without
the binaries the suite is skipped on a laptop and fails in CI (CI=true).
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

import pytest
from eaglenest_testing import free_port


def _missing(what: str) -> None:
    msg = f"{what} not installed (scripts/test.sh installs it with apt-get)"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins:
        _missing("postgresql")
    bindir = os.path.dirname(bins[-1])
    data = tempfile.mkdtemp(prefix="eaglenest-pg-")
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(data, pw.pw_uid, pw.pw_gid)
    port = free_port()
    subprocess.run(_as_postgres([f"{bindir}/initdb", "-D", data, "-U", "eaglenest",
                                 "--auth=trust", "-E", "UTF8"]), check=True,
                   capture_output=True)
    opts = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(_as_postgres([f"{bindir}/pg_ctl", "-D", data, "-o", opts, "-w", "-l",
                                 f"{data}/log", "start"]), check=True, capture_output=True)
    try:
        subprocess.run(_as_postgres([f"{bindir}/createdb", "-h", "127.0.0.1", "-p", str(port),
                                     "-U", "eaglenest", "eaglenest"]), check=True)
        yield f"postgresql+psycopg://eaglenest@127.0.0.1:{port}/eaglenest"
    finally:
        subprocess.run(_as_postgres([f"{bindir}/pg_ctl", "-D", data, "-m", "fast", "stop"]),
                       capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    exe = shutil.which("redis-server", path="/usr/bin:/usr/sbin:/usr/local/bin")
    if exe is None:
        _missing("redis-server")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    import redis

    deadline = time.monotonic() + 10
    while True:
        try:
            if redis.Redis(port=port).ping():
                break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)
