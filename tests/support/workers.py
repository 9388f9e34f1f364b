"""`eaglenest worker` processes beside a Stack whose `up` runs the API alone, as the
multi-host layouts run them (tests/integration): each logs to its own file."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.stack import Stack

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Worker:
    """`eaglenest worker --queues <queue>` as its own process, logging to its own file."""

    queue: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def entries(self) -> list[dict]:
        """Every line the worker wrote, as JSON (a line that is not JSON fails the test)."""
        return [json.loads(x) for x in self.log_path.read_text().splitlines() if x.strip()]

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while ' ready."' not in self.log_path.read_text():
            assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, self.log_path.read_text()[-3000:]
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self) -> None:
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_worker(stack: Stack, queue: str, *args: str, name: str | None = None,
                 env: dict[str, str] | None = None) -> Worker:
    """A worker consuming `queue`; its log is `worker-<name or queue>.log` in the data dir
    (appended to by a later worker of the same name); `env` is added to the stack's."""
    log_path = stack.data_dir / f"worker-{name or queue}.log"
    with open(log_path, "ab") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "eaglenest.cli", "worker", "--queues", queue, *args],
            env={**stack.env(), **(env or {})}, cwd=ROOT, stdout=subprocess.DEVNULL,
            stderr=log)
    return Worker(queue, proc, log_path)


def upload(stack: Stack, src: Path, dst: str) -> None:
    r = subprocess.run([sys.executable, "-m", "eaglenest.cli", "s3", "cp", str(src), dst],
                       env=stack.env(), capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
