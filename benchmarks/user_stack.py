"""`eaglenest up` as a user starts it, for the benchmarks that drive the whole service
(benchmarks/endpoint.py, benchmarks/full_job.py).

Contract:
- `up` runs on the given data dir with the caller's environment less its EAGLENEST_*
  variables: the shipped settings (per-account quotas included) and nothing of the caller's
  own EagleNest. `settings` is what `up` resolves from that environment.
- Requests are signed with the key pair `up` writes on its first start
  (`<data-dir>/credentials`, workers/infra/credentials.py), as a user's are.
- `start()` returns once `up` printed its banner, which it does after its API answers
  /ping on the port (workers/infra/supervisor.py); it raises, with `up`'s console, when
  `up` exits or stays silent instead.
- `up` is an owned child (foundation/host/children.py): it dies with the benchmark, SIGKILL
  included, and `stop()` stops it as Ctrl-C does (worker, then API, then broker).

The tests start `up` their own way (tests/support/stack.py: fixed keys, quotas raised for
the suites); a benchmark never imports tests (.importlinter).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.credentials import Credentials

from eaglenest.foundation.host import children
from eaglenest.foundation.host.processes import free_port
from eaglenest.foundation.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
#: the first words of `up`'s banner (workers/infra/credentials.py `usage`)
BANNER = "EagleNest is listening on"


@dataclass
class UserStack:
    """One `up` on `data_dir` (made if missing), serving on `port` of 127.0.0.1."""

    data_dir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    record: children.ChildRecord | None = None

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()  # as `up` resolves it

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def settings(self) -> Settings:
        """`up`'s settings: the defaults on this data dir (env() sets no other EAGLENEST_*)."""
        return Settings.model_construct(data_dir=self.data_dir)

    @property
    def console_file(self) -> Path:
        """`up`'s console: what it printed on stdout and stderr."""
        return self.data_dir / "up-console.log"

    def env(self) -> dict[str, str]:
        """The environment of `up` and of any `eaglenest` command run against it."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLENEST_")}
        return {**env, "EAGLENEST_DATA_DIR": str(self.data_dir)}

    def start(self, timeout: float = 120) -> UserStack:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.console_file, "ab") as console:
            self.proc, self.record = children.spawn(
                [sys.executable, "-m", "eaglenest.cli", "up", "--port", str(self.port)],
                role="up", resource=str(self.data_dir), env=self.env(), cwd=ROOT,
                stdout=console, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while BANNER not in self.console():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"eaglenest up did not start:\n{self.console()[-3000:]}")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        """SIGTERM, as Ctrl-C: `up` stops its worker, API and broker in turn (a minute at
        most, then SIGKILL)."""
        if self.record is not None:
            children.stop(self.record, timeout=60, proc=self.proc)
            self.record = None

    def console(self) -> str:
        path = self.console_file
        return path.read_text(errors="replace") if path.exists() else ""

    def credentials(self) -> Credentials:
        """The key pair `up` wrote on its first start, the only one of this data dir."""
        (key,) = self.settings.keys().values()
        return Credentials(key.access_key_id, key.secret)

    def client(self, service: str = "sagemaker") -> Any:
        """A boto3 client of `service` signed with credentials(), one attempt per call (a
        retry would hide a failure, and time it twice)."""
        creds = self.credentials()
        session = boto3.Session(aws_access_key_id=creds.access_key,
                                aws_secret_access_key=creds.secret_key,
                                region_name=self.settings.region)
        return session.client(service, endpoint_url=self.url,
                              config=Config(retries={"total_max_attempts": 1}))

