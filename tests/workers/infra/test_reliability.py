"""Reliability: a worker SIGKILLed mid-training, and a graceful shutdown mid-training. In
both cases the job resumes from its checkpoint and completes; it is never left stuck."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

from tests.support.jobs import job, upload, wait_status
from tests.support.stack import ACCOUNT, Stack


@pytest.fixture
def stack(tmp_path, tiny_llama_dir):
    s = Stack(tmp_path, extra_env={"EAGLENEST_JOB_LEASE_SECONDS": "6"}).start()
    upload(s, tiny_llama_dir, "s3://models/tiny-llama/")
    yield s
    s.stop()


def reliable_job() -> dict:
    args = job("s3://models/tiny-llama/", EAGLENEST_MAX_STEPS="300",
               EAGLENEST_CHECKPOINT_EVERY="10", EAGLENEST_BENCHMARK="0")
    return args


def worker_pid(stack: Stack) -> int:
    assert stack.proc is not None
    for child in psutil.Process(stack.proc.pid).children():
        if "celeryd" in " ".join(child.cmdline()) or "worker" in child.cmdline():
            return child.pid
    kids = [c.cmdline() for c in psutil.Process(stack.proc.pid).children()]
    raise AssertionError(f"no worker process among {kids}")


def wait_checkpoint(stack: Stack, name: str, timeout: float = 120) -> None:
    latest = stack.data_dir / "jobs" / ACCOUNT / name / "train" / "checkpoints" / "latest"
    deadline = time.monotonic() + timeout
    while not latest.exists():
        assert time.monotonic() < deadline, stack.log()[-3000:]
        time.sleep(0.2)


def steps_logged(stack: Stack, name: str) -> list[int]:
    path = stack.data_dir / "s3" / "output" / "jobs" / name / "training_log.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_worker_killed_mid_training_resumes_from_checkpoint(stack):
    sm = stack.client()
    sm.create_optimization_job(OptimizationJobName="killed", **reliable_job())
    wait_status(sm, "killed", {"INPROGRESS"})
    wait_checkpoint(stack, "killed")
    os.kill(worker_pid(stack), signal.SIGKILL)  # `up` restarts the worker
    d = wait_status(sm, "killed", {"COMPLETED", "FAILED"}, timeout=600)
    assert d["OptimizationJobStatus"] == "COMPLETED", d.get("FailureReason")
    assert "lost its worker" in stack.log()
    assert steps_logged(stack, "killed") == list(range(1, 301))


def test_graceful_shutdown_hands_the_job_back(stack):
    sm = stack.client()
    sm.create_optimization_job(OptimizationJobName="handed-back", **reliable_job())
    wait_status(sm, "handed-back", {"INPROGRESS"})
    wait_checkpoint(stack, "handed-back")
    stack.stop()
    assert "handed back at shutdown" in stack.log()
    stack.start()
    sm = stack.client()
    d = wait_status(sm, "handed-back", {"COMPLETED", "FAILED"}, timeout=600)
    assert d["OptimizationJobStatus"] == "COMPLETED", d.get("FailureReason")
    assert steps_logged(stack, "handed-back") == list(range(1, 301))
