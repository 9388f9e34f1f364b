"""The job's vLLM child processes (workers/jobs/vllm_capture.py, vllm_regenerate.py): one
way to start, watch, stop and reap them.

A child runs ``python -m MODULE RUN.json`` from the folder holding the eaglenest package,
in a confined environment (foundation/environment.py) plus the job's GPUs, with vLLM's
socket folder in a private scratch directory, recorded in the worker's children_dir
(foundation/host/children.py) so a dead worker's successor reaps it. Its output goes to
``<stem>.log`` beside ``<stem>.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

POLL_SECONDS = 0.5


def run_child(module: str, run: dict[str, Any], stem: Path, poll: Callable[[], None],
              check: Callable[[], None], *, children_dir: Path | None = None,
              resource: str = "", env: dict[str, str] | None = None) -> None:
    """Run ``module`` over ``run`` (written to ``stem``.json) to the end, calling ``check()``
    then ``poll()`` every POLL_SECONDS: whatever they raise (a stop) stops the child and
    every process under it, and is raised. RuntimeError names the child's first error when
    it exits with a failure."""
    from eaglenest.foundation.environment import child_environment
    from eaglenest.foundation.host import children
    from eaglenest.workers.jobs.train_launch import PACKAGE_ROOT, first_error
    from eaglenest.workers.model_servers.process import VLLM_RPC_ENV

    run_file, log_file = stem.with_suffix(".json"), stem.with_suffix(".log")
    run_file.write_text(json.dumps(run))
    fixed = dict(env or {})
    if run.get("device") == "cpu":
        fixed.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # buffers over 128 KiB (a request's hidden states) go back to the OS when freed; with
    # glibc's rising default threshold they stay in the heap and the engine grows with
    # the number of requests (docs/capture-shards.md "Memory")
    fixed.setdefault("MALLOC_MMAP_THRESHOLD_", str(128 << 10))
    cmd = [sys.executable, "-m", module, str(run_file)]
    with open(log_file, "wb") as out:
        proc, record = children.spawn(
            cmd, role=module.rsplit(".", 1)[-1], resource=resource, children_dir=children_dir,
            env=child_environment(None, **fixed), scratch_env=(VLLM_RPC_ENV,),
            stdout=out, stderr=subprocess.STDOUT, cwd=PACKAGE_ROOT)
        try:
            while proc.poll() is None:
                time.sleep(POLL_SECONDS)
                check()
                poll()
        finally:
            children.stop(record, timeout=10, proc=proc)
            children.forget(children_dir, record)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} exited with status {proc.returncode}: "
                           f"{first_error(log_file)}")


def engine_base(run: dict[str, Any]) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments every child uses: the target, the job's dtype (float32 on
    the CPU, the GPU dtype on CUDA: workers/jobs/job_target.py), tensor parallelism (a
    degree that divides the target's heads), eager mode on the CPU (no graphs to capture
    there), a fixed seed; the run's ``gpu_memory_utilization`` when it names one."""
    base = {"model": run["model"], "dtype": run["dtype"], "seed": 0,
            "tensor_parallel_size": int(run["tensor_parallel_size"]),
            "enforce_eager": run["device"] == "cpu"}
    if run.get("gpu_memory_utilization"):
        base["gpu_memory_utilization"] = float(run["gpu_memory_utilization"])
    return base
