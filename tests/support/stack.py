"""A real `eaglenest up` stack (API + Celery worker + embedded Redis) in a temporary data
dir, with fixed keys, and boto3 clients signed with them: what the tests (tests/conftest.py)
run against; and waiting on it (`wait_for`, `wait_described`, `wait_endpoint`), with its
log's tail when a wait times out. The benchmarks start theirs as a user does
(benchmarks/user_stack.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx
from botocore.config import Config

from eaglenest.foundation.host.processes import free_port

ACCESS_KEY = "AKIAEAGLENESTTEST001"
SECRET_KEY = "test-secret-key-0123456789abcdefghijklmno"
REGION = "us-east-1"
ACCOUNT = "123456789012"


@dataclass
class Stack:
    data_dir: Path
    port: int = field(default_factory=free_port)
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def database_url(self) -> str:
        return f"sqlite:///{(self.data_dir / 'eaglenest.db').resolve()}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLENEST_")}
        env.update(
            EAGLENEST_DATA_DIR=str(self.data_dir), EAGLENEST_ACCESS_KEY_ID=ACCESS_KEY,
            EAGLENEST_SECRET_ACCESS_KEY=SECRET_KEY, EAGLENEST_ACCOUNT_ID=ACCOUNT,
            EAGLENEST_REGION=REGION, PYTHONUNBUFFERED="1",
            # suites create far more than a team's quotas allow; the quota
            # tests (tests/security/test_quotas.py) set their own
            EAGLENEST_MAX_ENDPOINTS="10000", EAGLENEST_MAX_INSTANCES="10000",
            EAGLENEST_MAX_CONCURRENT_OPTIMIZATION_JOBS="10000", EAGLENEST_MAX_GPUS="unlimited",
            EAGLENEST_MAX_MODELS="unlimited", EAGLENEST_MAX_ENDPOINT_CONFIGS="unlimited",
            EAGLENEST_MAX_OPTIMIZATION_JOBS="unlimited",
            # and this machine's compute-process budget is shared by every stack a suite runs
            EAGLENEST_MAX_COMPUTE_PROCESSES="10000",
        )
        env.update(self.extra_env)
        return env

    def start(self) -> Stack:
        log = open(self.data_dir / "stack.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eaglenest.cli", "up", "--port", str(self.port)],
            env=self.env(), stdout=log, stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parent.parent,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"eaglenest up exited: {self.console()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/ping", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"eaglenest up did not answer in 60 s: {self.log()[-3000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log(self) -> str:
        """Everything the stack wrote: `up`'s log file (its children's output, its own
        records and what it printed), or its console before that file exists."""
        path = self.data_dir / "eaglenest.log"
        return path.read_text(errors="replace") if path.exists() else self.console()

    def console(self) -> str:
        """What `up` printed on its console (stdout and stderr)."""
        path = self.data_dir / "stack.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def deployment(self, endpoint: str, account: str = ACCOUNT) -> dict:
        """The deployment of `account`'s endpoint as the worker stored it (`Servers`: per
        variant the record with its `instances`, each with url and pid)."""
        from eaglenest.db.session import Database
        from eaglenest.db.tables import EndpointRow

        db = Database(self.database_url)
        try:
            with db.session() as s:
                return dict(s.query(EndpointRow).filter_by(
                    name=endpoint, account_id=account).one().deployment)
        finally:
            db.dispose()

    def client(self, service: str = "sagemaker", **kw: str) -> Any:
        return boto3.client(
            service, endpoint_url=self.url, region_name=kw.get("region", REGION),
            aws_access_key_id=kw.get("key", ACCESS_KEY),
            aws_secret_access_key=kw.get("secret", SECRET_KEY),
            config=Config(retries={"total_max_attempts": 1}),
        )


def wait_for(pred: Callable[[], Any], timeout: float, what: str, stack: Stack | None = None
             ) -> Any:
    """`pred()`'s first truthy value, asked every 0.2 s; past `timeout` the test fails with
    `what` and, given the stack, its log's tail."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: {stack.log()[-3000:] if stack else ''}"
        time.sleep(0.2)


def wait_described(describe: Callable[[], Any], status: str, want: Collection[str],
                   timeout: float, stack: Stack | None = None) -> dict[str, Any]:
    """`describe()` (a Describe* call) once its `status` field is one of `want`, asked every
    0.5 s; past `timeout` the test fails with the last description and, given the stack,
    its log's tail."""
    deadline = time.monotonic() + timeout
    while True:
        d = dict(describe())
        if d[status] in want:
            return d
        assert time.monotonic() < deadline, (d, stack.log()[-3000:] if stack else "")
        time.sleep(0.5)


def wait_endpoint(sm: Any, name: str, want: Collection[str], timeout: float = 120,
                  stack: Stack | None = None) -> dict[str, Any]:
    """DescribeEndpoint of `name` once its EndpointStatus is one of `want`."""
    return wait_described(lambda: sm.describe_endpoint(EndpointName=name), "EndpointStatus",
                          want, timeout, stack)
