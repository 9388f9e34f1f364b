"""What the fault tests share beyond tests/support (the stack, uploads, job requests,
waiting): the processes of one stack (found by scanning /proc for its data directory in
their environment, so a process that escaped its parent's tree is found too), the fault
tests' job and endpoint arguments and what a job logged."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.support.jobs import ROLE, job
from tests.support.stack import Stack


def stack_processes(stack: Stack) -> dict[int, str]:
    """pid -> command line of every live process started for this stack, zombies excluded:
    the control plane's (the data dir is in their environment), the children it starts
    (confined environments without it: their command line names a path in the data dir)
    and whatever those start (they inherit the child's EAGLENEST_CHILD_TAG)."""
    dirs = {str(stack.data_dir), str(stack.data_dir.resolve())}
    markers = {f"EAGLENEST_DATA_DIR={d}".encode() for d in dirs}
    found: dict[int, str] = {}
    tags: dict[int, bytes] = {}
    for proc in psutil.process_iter(["pid"]):
        try:
            env = set(Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0"))
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(proc.cmdline())
            tag = next((e for e in env if e.startswith(b"EAGLENEST_CHILD_TAG=")), None)
            if tag is not None:
                tags[proc.pid] = tag
            if markers & env or any(d in cmd for d in dirs):
                found[proc.pid] = cmd
        except (OSError, psutil.Error):
            continue
    ours = {tags[pid] for pid in found if pid in tags}
    for pid, tag in tags.items():
        if tag in ours and pid not in found:
            try:
                found[pid] = " ".join(psutil.Process(pid).cmdline())
            except psutil.Error:
                continue
    return found


def stack_core(stack: Stack) -> set[int]:
    """`eaglenest up` and its direct children: the API, the worker, the broker."""
    assert stack.proc is not None
    up = psutil.Process(stack.proc.pid)
    return {up.pid, *(c.pid for c in up.children())}  # zombies included: not running


def strays(stack: Stack, allowed: set[int] = frozenset()) -> dict[int, str]:  # type: ignore[assignment]
    """Processes of this stack beyond `up`, its API, worker and broker (and `allowed`)."""
    core = stack_core(stack) | set(allowed)
    return {pid: cmd for pid, cmd in stack_processes(stack).items() if pid not in core}


def assert_no_strays(stack: Stack, timeout: float = 20, allowed: set[int] = frozenset()
                     ) -> None:  # type: ignore[assignment]
    deadline = time.monotonic() + timeout
    while strays(stack, allowed):
        assert time.monotonic() < deadline, f"left running: {strays(stack, allowed)}"
        time.sleep(0.2)


def _child(stack: Stack, command: str) -> int | None:
    """The live child of `up` running `eaglenest <command>`, if any (Celery retitles the
    worker `[celeryd: ...]`)."""
    assert stack.proc is not None
    for child in psutil.Process(stack.proc.pid).children():
        try:
            cmdline = child.cmdline()
            if command in cmdline or (command == "worker" and "celeryd" in " ".join(cmdline)):
                return int(child.pid)
        except psutil.Error:  # exited meanwhile, or a zombie `up` has not reaped yet
            continue
    return None


def worker_pid(stack: Stack) -> int:
    pid = _child(stack, "worker")
    assert pid is not None, "no worker process"
    return pid


def api_pid(stack: Stack) -> int | None:
    return _child(stack, "api")


def api_answers(stack: Stack) -> bool:
    """The API accepts connections (a restarted one takes seconds to listen again)."""
    try:
        return httpx.get(f"{stack.url}/ping", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def job_args(model_uri: str, **env: str) -> dict[str, Any]:
    """tests/support/jobs.py's request with the fault tests' shorter sequences, one benchmark
    level and K 1 and 3 (what no EAGLENEST_BENCH_KS gives at 3 speculative tokens); the tests
    that train name their EAGLENEST_MAX_STEPS."""
    return job(model_uri, **{"EAGLENEST_MAX_LENGTH": "128", "EAGLENEST_BENCH_CONCURRENCY": "1",
                             "EAGLENEST_BENCH_KS": "1,3", **env})


def job_status(sm: Any, name: str) -> dict[str, Any]:
    return dict(sm.describe_optimization_job(OptimizationJobName=name))


def steps_logged(stack: Stack, name: str) -> list[int]:
    path = stack.data_dir / "s3" / "output" / "jobs" / name / "training_log.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def serving_env(**extra: str) -> dict[str, str]:
    return {"EAGLENEST_SERVING_BACKEND": "embedded", "EAGLENEST_MAX_MODEL_LEN": "256",
            "OMP_NUM_THREADS": "1", **extra}


def make_endpoint(sm: Any, name: str, model_uri: str, env: dict[str, str],
                  capture: bool = False, url_only: bool = False) -> None:
    """Model, config and endpoint `name` serving `model_uri` (a prefix, or a single object
    as ModelDataUrl with `url_only`)."""
    container: dict[str, Any] = {"Image": "eaglenest", "Environment": env}
    if url_only:
        container["ModelDataUrl"] = model_uri
    else:
        container["ModelDataSource"] = {"S3DataSource": {
            "S3Uri": model_uri, "S3DataType": "S3Prefix", "CompressionType": "None"}}
    sm.create_model(ModelName=name, ExecutionRoleArn=ROLE, PrimaryContainer=container)
    kw: dict[str, Any] = {}
    if capture:
        kw["DataCaptureConfig"] = {
            "EnableCapture": True, "InitialSamplingPercentage": 100,
            "DestinationS3Uri": "s3://capture/traffic",
            "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}]}
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": name, "InstanceType": "ml.g5.2xlarge",
        "InitialInstanceCount": 1, "ContainerStartupHealthCheckTimeoutInSeconds": 300}], **kw)
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)


def endpoint_status(sm: Any, name: str) -> dict[str, Any]:
    return dict(sm.describe_endpoint(EndpointName=name))
