"""GPU hosts on one machine: two workers on one Postgres database and one Redis broker, each
with a declared inventory (EAGLENEST_GPUS) and a host name of its own: host-a with 2 x 24 GiB
GPUs, host-b with 4. Endpoints are served by vLLM's command line run as a stand-in server
(tests/support/fake_vllm.py, EAGLENEST_VLLM_MODULE): what is checked is where each instance
is placed, the GPUs it holds (the database), and the command line and environment its
process was started with (psutil); the job trains the tiny Llama target on the CPU.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from eaglenest.db import placement_repo
from eaglenest.db.session import Database
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation.queue import OPTIMIZE_TASK, TaskQueue
from tests.support.stack import ACCOUNT, Stack
from tests.support.workers import ROOT, Worker, start_worker, upload

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="the vllm backend needs vllm installed")
ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"
WAIT = 20  # EAGLENEST_CAPACITY_WAIT_SECONDS of both workers
CAPACITY = "Unable to provision requested ML compute capacity"
HOSTS = {"host-a": "2x24GiB:A10G", "host-b": "4x24GiB:A10G"}


def _arn(kind: str, name: str) -> str:
    return f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:{kind}/{name}"


def _start(stack: Stack, host: str) -> Worker:
    return start_worker(stack, "train,serve", "--concurrency", "6", name=host, env={
        "EAGLENEST_HOST_NAME": host, "EAGLENEST_GPUS": HOSTS[host]})


@pytest.fixture(scope="module")
def hosts(tmp_path_factory, postgres_server, redis_server, tiny_llama_dir
          ) -> Iterator[tuple[Stack, dict[str, Worker]]]:
    with two_hosts(tmp_path_factory, postgres_server, redis_server, tiny_llama_dir,
                   "gpu_hosts", 8) as out:
        yield out


@contextlib.contextmanager
def two_hosts(tmp_path_factory: Any, postgres_server: Any, redis_server: Any,
              tiny_llama_dir: Any, db_name: str, broker_db: int
              ) -> Iterator[tuple[Stack, dict[str, Worker]]]:
    """The stack and the workers of HOSTS on database `db_name` and Redis db `broker_db` (a
    module's own: a fixture of each module that uses it)."""
    database = postgres_server.create_database(db_name)
    broker = redis_server.url.rsplit("/", 1)[0] + f"/{broker_db}"
    stack = Stack(tmp_path_factory.mktemp(db_name.replace("_", "-")), extra_env={
        "EAGLENEST_DATABASE_URL": database, "EAGLENEST_BROKER_URL": broker,
        "EAGLENEST_WORKER_QUEUES": "", "EAGLENEST_CAPACITY_WAIT_SECONDS": str(WAIT),
        "EAGLENEST_VLLM_MODULE": "tests.support.fake_vllm", "EAGLENEST_LOG_FORMAT": "json"})
    stack.start()
    workers: dict[str, Worker] = {}
    try:
        upload(stack, tiny_llama_dir, "s3://models/tiny/")
        for host in HOSTS:
            workers[host] = _start(stack, host)
        for w in workers.values():
            w.wait_ready()
        sm = stack.client()
        for name, env in (("vllm", {}), ("vllm-tp2", {"SM_NUM_GPUS": "2"})):
            sm.create_model(ModelName=name, ExecutionRoleArn=ROLE, PrimaryContainer={
                "Image": "vllm", "Environment": {
                    "EAGLENEST_SERVING_BACKEND": "vllm", "EAGLENEST_MAX_MODEL_LEN": "256",
                    "HF_TOKEN": "hf_not_for_the_process", **env},
                "ModelDataSource": {"S3DataSource": {
                    "S3Uri": "s3://models/tiny/", "S3DataType": "S3Prefix",
                    "CompressionType": "None"}}})
        for itype in ("ml.g5.xlarge", "ml.g5.12xlarge", "ml.g5.48xlarge"):
            for model in ("vllm", "vllm-tp2"):
                sm.create_endpoint_config(
                    EndpointConfigName=f"{model}-{itype.replace('.', '-')}",
                    ProductionVariants=[{"VariantName": "AllTraffic", "ModelName": model,
                                         "InstanceType": itype, "InitialInstanceCount": 1}])
        yield stack, workers
    finally:
        for w in workers.values():
            w.stop()
        for w in workers.values():
            w.wait()
        stack.stop()


def _config(model: str, itype: str) -> str:
    return f"{model}-{itype.replace('.', '-')}"


def _holdings(stack: Stack) -> list[tuple[str, int, str, str, str]]:
    """(host, GPU, holder, unit, owner) of every GPU held now."""
    db = Database(stack.extra_env["EAGLENEST_DATABASE_URL"])
    try:
        with db.session() as s:
            return [(h.host, h.gpu_index, h.holder, h.unit, h.owner)
                    for h in placement_repo.holdings(s)]
    finally:
        db.dispose()


def _instance(stack: Stack, name: str) -> dict:
    """The one instance of the endpoint's variant, as its worker recorded it."""
    db = Database(stack.extra_env["EAGLENEST_DATABASE_URL"])
    try:
        with db.session() as s:
            row = s.query(EndpointRow).filter_by(name=name, account_id=ACCOUNT).one()
            (inst,) = row.deployment["Servers"]["AllTraffic"]["instances"]
            return dict(inst)
    finally:
        db.dispose()


def _wait_status(sm: Any, name: str, done: tuple[str, ...], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        d = sm.describe_endpoint(EndpointName=name)
        if d["EndpointStatus"] in done:
            return d
        assert time.monotonic() < deadline, d
        time.sleep(0.5)


def _process(inst: dict) -> tuple[list[str], dict[str, str]]:
    proc = psutil.Process(inst["pid"])
    return proc.cmdline(), proc.environ()


def _delete(sm: Any, *names: str) -> None:
    for name in names:
        sm.delete_endpoint(EndpointName=name)
    for name in names:
        sm.get_waiter("endpoint_deleted").wait(
            EndpointName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 120})


def test_four_gpu_type_lands_on_the_host_that_has_four(hosts):
    stack, _ = hosts
    sm = stack.client()
    sm.create_endpoint(EndpointName="big", EndpointConfigName=_config("vllm", "ml.g5.12xlarge"))
    d = _wait_status(sm, "big", ("InService", "Failed"))
    assert d["EndpointStatus"] == "InService", d.get("FailureReason")
    assert d["ProductionVariants"][0]["CurrentInstanceCount"] == 1
    inst = _instance(stack, "big")
    assert inst["host"] == "host-b" and sorted(inst["gpus"]) == [0, 1, 2, 3]
    cmd, env = _process(inst)
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "4"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    # HF_TOKEN: stored and echoed back as AWS does, never in the model server's environment
    assert sm.describe_model(ModelName="vllm")["PrimaryContainer"]["Environment"][
        "HF_TOKEN"] == "hf_not_for_the_process"
    assert "HF_TOKEN" not in env
    held = [(h, i) for h, i, holder, *_ in _holdings(stack) if holder == _arn("endpoint", "big")]
    assert sorted(held) == [("host-b", i) for i in range(4)]
    # seen by operators: `eaglenest status` and /metrics
    status = subprocess.run([sys.executable, "-m", "eaglenest.cli", "status"],
                            env=stack.env(), capture_output=True, text=True, cwd=ROOT)
    lines = status.stdout.splitlines()
    assert "hosts: 2" in lines, status.stdout
    assert any(x.startswith("  host-b: 4 GPU(s); workers ") for x in lines), status.stdout
    assert f"    GPU 3 A10G 24 GiB: endpoint/big ({ACCOUNT}) {inst['unit']}" in lines
    assert "    GPU 1 A10G 24 GiB: free" in lines  # host-a's second GPU
    metrics = httpx.get(f"{stack.url}/metrics", timeout=10).text.splitlines()
    assert 'eaglenest_host_gpus{host="host-b"} 4' in metrics
    assert 'eaglenest_host_gpus_held{host="host-b"} 4' in metrics
    assert 'eaglenest_host_gpus_held{host="host-a"} 0' in metrics

    # A second one finds no host with four free GPUs: Failed after the wait, nothing held.
    t0 = time.monotonic()
    sm.create_endpoint(EndpointName="big-2",
                       EndpointConfigName=_config("vllm", "ml.g5.12xlarge"))
    d2 = _wait_status(sm, "big-2", ("InService", "Failed"), timeout=WAIT + 60)
    assert d2["EndpointStatus"] == "Failed"
    assert d2["FailureReason"].startswith(CAPACITY) and "ml.g5.12xlarge" in d2["FailureReason"]
    assert time.monotonic() - t0 >= WAIT - 1
    assert not [h for h in _holdings(stack) if h[2] == _arn("endpoint", "big-2")]

    # A one-GPU job meanwhile runs beside it, on host-a.
    sm.create_optimization_job(
        OptimizationJobName="beside", RoleArn=ROLE,
        ModelSource={"S3": {"S3Uri": "s3://models/tiny/"}},
        DeploymentInstanceType="ml.g5.2xlarge",
        OptimizationEnvironment={
            "EAGLENEST_MAX_STEPS": "2", "EAGLENEST_MAX_LENGTH": "128",
            "EAGLENEST_DATASET": "gsm8k_training.jsonl", "EAGLENEST_HOLDOUT": "2",
            "EAGLENEST_DRAFT_VOCAB_SIZE": "64", "EAGLENEST_BENCHMARK": "0",
            "EAGLENEST_DEVICE": "cpu", "HF_TOKEN": "x"},
        OptimizationConfigs=[{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
        OutputConfig={"S3OutputLocation": "s3://output/jobs/"},
        StoppingCondition={"MaxRuntimeInSeconds": 600})
    seen: set[tuple[str, int]] = set()
    deadline = time.monotonic() + 240
    while (job := sm.describe_optimization_job(OptimizationJobName="beside"))[
            "OptimizationJobStatus"] not in ("COMPLETED", "FAILED", "STOPPED"):
        seen |= {(h, i) for h, i, holder, *_ in _holdings(stack)
                 if holder == _arn("optimization-job", "beside")}
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert job["OptimizationJobStatus"] == "COMPLETED", job.get("FailureReason")
    assert seen == {("host-a", 0)}
    assert not [h for h in _holdings(stack) if h[2] == _arn("optimization-job", "beside")]

    _delete(sm, "big", "big-2")
    assert not [h for h in _holdings(stack) if h[2] == _arn("endpoint", "big")]
    assert not psutil.pid_exists(inst["pid"]) or psutil.Process(inst["pid"]).status() == "zombie"


def test_sm_num_gpus_sets_the_tensor_parallel_size_within_the_instance(hosts):
    stack, _ = hosts
    sm = stack.client()
    sm.create_endpoint(EndpointName="tp2",
                       EndpointConfigName=_config("vllm-tp2", "ml.g5.12xlarge"))
    d = _wait_status(sm, "tp2", ("InService", "Failed"))
    assert d["EndpointStatus"] == "InService", d.get("FailureReason")
    inst = _instance(stack, "tp2")
    cmd, env = _process(inst)
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"  # as LMI reads SM_NUM_GPUS
    assert inst["host"] == "host-b" and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    _delete(sm, "tp2")


def test_an_update_that_cannot_be_placed_rolls_back(hosts):
    stack, _ = hosts
    sm = stack.client()
    sm.create_endpoint(EndpointName="small", EndpointConfigName=_config("vllm", "ml.g5.xlarge"))
    assert _wait_status(sm, "small", ("InService", "Failed"))["EndpointStatus"] == "InService"
    before = _instance(stack, "small")
    sm.update_endpoint(EndpointName="small",
                       EndpointConfigName=_config("vllm", "ml.g5.48xlarge"))  # 8 GPUs: none
    time.sleep(1)
    d = _wait_status(sm, "small", ("InService", "Failed"), timeout=WAIT + 60)
    assert d["EndpointStatus"] == "InService"
    assert d["EndpointConfigName"] == _config("vllm", "ml.g5.xlarge")
    assert d["FailureReason"].startswith(
        f"Update to {_config('vllm', 'ml.g5.48xlarge')} failed and was rolled back: {CAPACITY}")
    assert _instance(stack, "small")["pid"] == before["pid"] and psutil.pid_exists(before["pid"])
    held = [(h, i, u) for h, i, holder, u, _ in _holdings(stack)
            if holder == _arn("endpoint", "small")]
    assert held == [(before["host"], before["gpus"][0], before["unit"])]
    _delete(sm, "small")


def test_concurrent_creates_never_share_a_gpu(hosts):
    stack, _ = hosts
    sm = stack.client()
    names = [f"one-{i}" for i in range(10)]
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        list(pool.map(lambda n: stack.client().create_endpoint(
            EndpointName=n, EndpointConfigName=_config("vllm", "ml.g5.xlarge")), names))
    done = {n: _wait_status(sm, n, ("InService", "Failed"), timeout=WAIT + 120) for n in names}
    serving = [n for n, d in done.items() if d["EndpointStatus"] == "InService"]
    assert len(serving) == 6, {n: d.get("FailureReason") for n, d in done.items()}  # 2 + 4 GPUs
    for n, d in done.items():
        if n not in serving:
            assert d["FailureReason"].startswith(CAPACITY), d["FailureReason"]
    places = [(_instance(stack, n)["host"], _instance(stack, n)["gpus"][0]) for n in serving]
    assert len(set(places)) == 6
    assert sorted(places) == sorted((h, i) for h, i, *_ in _holdings(stack))
    for n in serving:
        _, env = _process(_instance(stack, n))
        assert env["CUDA_VISIBLE_DEVICES"] == str(_instance(stack, n)["gpus"][0])
    _delete(sm, *names)
    assert _holdings(stack) == []


def test_a_killed_workers_gpus_are_reclaimed_by_the_next(hosts):
    stack, workers = hosts
    sm = stack.client()
    sm.create_endpoint(EndpointName="fill-b",
                       EndpointConfigName=_config("vllm", "ml.g5.12xlarge"))
    assert _wait_status(sm, "fill-b", ("InService", "Failed"))["EndpointStatus"] == "InService"
    sm.create_endpoint(EndpointName="on-a", EndpointConfigName=_config("vllm", "ml.g5.xlarge"))
    assert _wait_status(sm, "on-a", ("InService", "Failed"))["EndpointStatus"] == "InService"
    inst = _instance(stack, "on-a")
    assert inst["host"] == "host-a"
    old = workers["host-a"]
    dead_owner = next(o for h, _, holder, _, o in _holdings(stack)
                      if holder == _arn("endpoint", "on-a"))
    os.kill(old.proc.pid, signal.SIGKILL)
    old.proc.wait()
    assert dead_owner in {h[4] for h in _holdings(stack)}  # nobody freed them yet
    workers["host-a"] = _start(stack, "host-a")
    workers["host-a"].wait_ready()
    deadline = time.monotonic() + 60
    while dead_owner in {h[4] for h in _holdings(stack)}:
        assert time.monotonic() < deadline, _holdings(stack)
        time.sleep(0.2)
    # the endpoint's server died with its worker; the next worker restarts it on host-a
    deadline = time.monotonic() + 120
    while (now := _instance(stack, "on-a"))["pid"] == inst["pid"] or \
            sm.describe_endpoint(EndpointName="on-a")["EndpointStatus"] != "InService":
        assert time.monotonic() < deadline, sm.describe_endpoint(EndpointName="on-a")
        time.sleep(0.5)
    assert now["host"] == "host-a" and psutil.pid_exists(now["pid"])
    assert dead_owner not in {h[4] for h in _holdings(stack)}
    _delete(sm, "fill-b", "on-a")


def test_a_duplicate_delivery_never_frees_the_running_jobs_gpu(hosts):
    """A job's task delivered several times at once (the reconciler re-enqueues a STARTING
    job beside the API's message): one attempt runs it and holds its GPU for the whole run;
    the others take none of its GPUs away."""
    stack, _ = hosts
    sm = stack.client()
    sm.create_optimization_job(
        OptimizationJobName="twice", RoleArn=ROLE,
        ModelSource={"S3": {"S3Uri": "s3://models/tiny/"}},
        DeploymentInstanceType="ml.g5.2xlarge",
        OptimizationEnvironment={
            "EAGLENEST_MAX_STEPS": "30", "EAGLENEST_MAX_LENGTH": "128",
            "EAGLENEST_DATASET": "gsm8k_training.jsonl", "EAGLENEST_HOLDOUT": "2",
            "EAGLENEST_DRAFT_VOCAB_SIZE": "64", "EAGLENEST_BENCHMARK": "0",
            "EAGLENEST_DEVICE": "cpu"},
        OptimizationConfigs=[{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
        OutputConfig={"S3OutputLocation": "s3://output/jobs/"},
        StoppingCondition={"MaxRuntimeInSeconds": 600})
    arn = _arn("optimization-job", "twice")
    queue = TaskQueue(stack.extra_env["EAGLENEST_BROKER_URL"])
    for q in ("train.host-a", "train.host-a", "train.host-b", "train"):
        assert queue.send(OPTIMIZE_TASK, arn, q)
    running, unheld = 0, []
    deadline = time.monotonic() + 240
    while (job := sm.describe_optimization_job(OptimizationJobName="twice"))[
            "OptimizationJobStatus"] not in ("COMPLETED", "FAILED", "STOPPED"):
        held = [(h, i) for h, i, holder, *_ in _holdings(stack) if holder == arn]
        if job["OptimizationJobStatus"] == "INPROGRESS":
            running += 1
            if not held and job["OptimizationJobStatus"] == sm.describe_optimization_job(
                    OptimizationJobName="twice")["OptimizationJobStatus"]:
                unheld.append(time.monotonic())  # still running, and no GPU held for it
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert job["OptimizationJobStatus"] == "COMPLETED", job.get("FailureReason")
    assert running >= 3 and unheld == [], (running, unheld)
    assert not [h for h in _holdings(stack) if h[2] == arn]
