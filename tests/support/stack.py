"""A real `eaglenest up` stack (API + Celery worker + embedded Redis) in a temporary data
dir, with fixed keys, and boto3 clients signed with them: what the benchmarks and the tests
(tests/conftest.py) run against."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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
            # suites and benchmarks create far more than a team's quotas allow; the quota
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

