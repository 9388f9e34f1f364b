"""The worker SIGKILLed mid-job (issue #22): during data-parallel training (torchrun and its
two ranks) and during the benchmark stage (a model server). Nothing the dead worker started
survives it, `up` restarts the worker, the job resumes and completes exactly once: every
training step is logged once, one torchrun at a time ever ran in the job's folder."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.reliability.reliability_helpers import (
    assert_no_strays,
    job_args,
    steps_logged,
    strays,
    worker_pid,
)
from tests.support.jobs import upload, wait_status
from tests.support.stack import ACCOUNT, Stack, wait_for


@pytest.fixture
def stack(tmp_path, tiny_llama_dir):
    s = Stack(tmp_path, extra_env={"EAGLENEST_JOB_LEASE_SECONDS": "4"}).start()
    upload(s, tiny_llama_dir, "s3://models/tiny-llama/")
    yield s
    s.stop()


def _kill_worker_when(stack: Stack, ready, what: str) -> dict[int, str]:  # type: ignore[no-untyped-def]
    """SIGKILL the worker once `ready()` holds; the processes it had started then."""
    wait_for(ready, 240, what, stack)
    children = strays(stack)
    os.kill(worker_pid(stack), signal.SIGKILL)
    return children


def test_worker_killed_during_data_parallel_training(stack):
    sm = stack.client()
    steps = 400
    args = job_args("s3://models/tiny-llama/", EAGLENEST_TRAIN_PROCESSES="2",
                    EAGLENEST_BENCHMARK="0", EAGLENEST_MAX_STEPS=str(steps),
                    EAGLENEST_CHECKPOINT_EVERY="10")
    args["DeploymentInstanceType"] = "ml.g5.12xlarge"  # 2 ranks need a type of >= 2 GPUs
    sm.create_optimization_job(OptimizationJobName="ddp-killed", **args)
    latest = stack.data_dir / "jobs" / ACCOUNT / "ddp-killed" / "train" / "checkpoints" / "latest"
    running = _kill_worker_when(
        stack, lambda: latest.exists() and len(strays(stack)) >= 3,
        "torchrun and two ranks never ran with a checkpoint written")
    assert sum("torch.distributed.run" in c for c in running.values()) == 1, running
    assert sum("workers.jobs.train_launch" in c for c in running.values()) >= 2, running
    assert_no_strays(stack, timeout=15)  # torchrun and both ranks died with the worker
    # the resumed job runs its own torchrun: never two at once
    deadline = time.monotonic() + 600
    while (d := sm.describe_optimization_job(OptimizationJobName="ddp-killed")
           )["OptimizationJobStatus"] not in ("COMPLETED", "FAILED", "STOPPED"):
        now = {p for p, c in strays(stack).items() if "torch.distributed.run" in c}
        assert len(now) <= 1, strays(stack)
        assert time.monotonic() < deadline, stack.log()[-3000:]
        time.sleep(0.2)
    assert d["OptimizationJobStatus"] == "COMPLETED", d.get("FailureReason")
    assert steps_logged(stack, "ddp-killed") == list(range(1, steps + 1))
    assert stack.log().count("job ddp-killed COMPLETED") == 1
    assert_no_strays(stack)


def test_worker_killed_during_the_benchmark(stack):
    sm = stack.client()
    sm.create_optimization_job(OptimizationJobName="bench-killed", **job_args(
        "s3://models/tiny-llama/", EAGLENEST_MAX_STEPS="4"))
    running = _kill_worker_when(
        stack, lambda: "benchmark baseline vs EAGLE" in stack.log() and any(
            "workers.model_servers.embedded" in c for c in strays(stack).values()),
        "the benchmark's model server never ran")
    assert any("workers.model_servers.embedded" in c for c in running.values()), running
    assert_no_strays(stack, timeout=15)  # the model server died with the worker
    d = wait_status(sm, "bench-killed", {"COMPLETED", "FAILED", "STOPPED"}, 600, stack)
    assert d["OptimizationJobStatus"] == "COMPLETED", d.get("FailureReason")
    assert stack.log().count("job bench-killed COMPLETED") == 1
    assert "lost its worker" in stack.log()
    assert_no_strays(stack)
