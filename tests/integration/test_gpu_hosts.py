"""GPU hosts on one machine: two workers on one Postgres database and one Redis broker, each
with a declared inventory (EAGLENEST_GPUS) and a host name of its own: host-a with 2 x 24 GiB
GPUs, host-b with 4. Endpoints are served by vLLM's command line run as a stand-in server
(tests/support/fake_vllm.py, EAGLENEST_VLLM_MODULE): what is checked is where each instance
is placed, the GPUs it holds (the database), and the command line and environment its
process was started with (psutil); the job trains the tiny Llama target on the CPU.
The stand-in records when each of its servers ran (fake_vllm_runs.jsonl): a job's
benchmark servers on GPUs run one at a time, each with the memory plan's command line.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from botocore.exceptions import ClientError
from safetensors import safe_open

from eaglenest.db import placement_repo
from eaglenest.db.session import Database
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation.instance_types import lookup
from eaglenest.foundation.memory_plan import gpus_of_type, head_estimate, plan, shape_of
from eaglenest.foundation.queue import OPTIMIZE_TASK, TaskQueue
from tests.support.fake_vllm import RUNS_FILE, read_runs
from tests.support.model_shapes import write_shape
from tests.support.stack import ACCOUNT, Stack, wait_endpoint
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
    d = wait_endpoint(sm, "big", ("InService", "Failed"))
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
    assert 'eaglenest_host_gpus{host="host-b"} 4.0' in metrics
    assert 'eaglenest_host_gpus_held{host="host-b"} 4.0' in metrics
    assert 'eaglenest_host_gpus_held{host="host-a"} 0.0' in metrics

    # A second one finds no host with four free GPUs: Failed after the wait, nothing held.
    t0 = time.monotonic()
    sm.create_endpoint(EndpointName="big-2",
                       EndpointConfigName=_config("vllm", "ml.g5.12xlarge"))
    d2 = wait_endpoint(sm, "big-2", ("InService", "Failed"), timeout=WAIT + 60)
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
    d = wait_endpoint(sm, "tp2", ("InService", "Failed"))
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
    assert wait_endpoint(sm, "small", ("InService", "Failed"))["EndpointStatus"] == "InService"
    before = _instance(stack, "small")
    sm.update_endpoint(EndpointName="small",
                       EndpointConfigName=_config("vllm", "ml.g5.48xlarge"))  # 8 GPUs: none
    time.sleep(1)
    d = wait_endpoint(sm, "small", ("InService", "Failed"), timeout=WAIT + 60)
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
    done = {n: wait_endpoint(sm, n, ("InService", "Failed"), timeout=WAIT + 120) for n in names}
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
    assert wait_endpoint(sm, "fill-b", ("InService", "Failed"))["EndpointStatus"] == "InService"
    sm.create_endpoint(EndpointName="on-a", EndpointConfigName=_config("vllm", "ml.g5.xlarge"))
    assert wait_endpoint(sm, "on-a", ("InService", "Failed"))["EndpointStatus"] == "InService"
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


# -- the memory plan on GPUs (issue #50): an 8B-shaped tiny target, a real 14B shape --------

#: bytes of Llama-3.1-8B's weights in float32 (2 x its bfloat16 checkpoint's total_size)
EIGHT_B_FP32_BYTES = 32_121_044_992
EIGHT_B = "s3://models/tiny-8b/"


@pytest.fixture(scope="module")
def eight_b(hosts, tiny_llama_dir, tmp_path_factory) -> Path:
    """The tiny Llama target dressed as an 8B model, uploaded to EIGHT_B: its own weights
    (transformers still loads the one model.safetensors, the job trains and serves on the
    CPU as fast as ever) plus a model.safetensors.index.json whose metadata.total_size is
    32.1 GB. The memory plan reads the index (foundation/memory_plan.shape_of): the tiny
    config says float32, so 32.1 GB / 4 bytes = 8.03B parameters, 16 GB in bfloat16 on a
    GPU (its weights per GPU on the plan), while heads, layers and lengths stay the tiny
    config's (4 attention heads, 2 KV heads, max_position_embeddings 512)."""
    stack, _ = hosts
    folder = tmp_path_factory.mktemp("tiny-8b") / "model"
    shutil.copytree(tiny_llama_dir, folder)
    with safe_open(folder / "model.safetensors", "pt") as f:
        names = list(f.keys())
    (folder / "model.safetensors.index.json").write_text(json.dumps({
        "metadata": {"total_size": EIGHT_B_FP32_BYTES},
        "weight_map": {name: "model.safetensors" for name in names}}))
    assert f"{shape_of(folder).parameters / 1e9:.2f}" == "8.03"
    upload(stack, folder, EIGHT_B)
    return folder


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _speculative_k(argv: list[str]) -> int | None:
    config = _flag(argv, "--speculative-config")
    return None if config is None else int(json.loads(config)["num_speculative_tokens"])


def test_benchmark_servers_on_a_gpu_run_one_at_a_time_as_planned(hosts, eight_b):
    """On a job's GPU the benchmark's servers (baseline, then one per K, order reversed in
    the second round) run one at a time, each planned on the job's GPU: never two at once,
    each with the plan's --gpu-memory-utilization and --max-model-len, no tensor
    parallelism on one GPU; the load generator counts the stand-in's tokens."""
    stack, _ = hosts
    sm = stack.client()
    name, ks, rounds = "bench-8b", (1, 3), 2
    sm.create_optimization_job(
        OptimizationJobName=name, RoleArn=ROLE, ModelSource={"S3": {"S3Uri": EIGHT_B}},
        DeploymentInstanceType="ml.g5.2xlarge",
        OptimizationEnvironment={
            "EAGLENEST_MAX_STEPS": "2", "EAGLENEST_MAX_LENGTH": "128",
            "EAGLENEST_REGENERATE": "0", "EAGLENEST_PLATEAU_EVALS": "0",
            "EAGLENEST_DATASET": "gsm8k_training.jsonl", "EAGLENEST_HOLDOUT": "2",
            "EAGLENEST_DRAFT_VOCAB_SIZE": "64", "EAGLENEST_DEVICE": "cpu",
            "EAGLENEST_SERVING_BACKEND": "vllm", "EAGLENEST_NUM_SPECULATIVE_TOKENS": "3",
            "EAGLENEST_BENCH_KS": ",".join(map(str, ks)),
            "EAGLENEST_BENCH_ROUNDS": str(rounds), "EAGLENEST_BENCH_MAX_ROUNDS": str(rounds),
            "EAGLENEST_BENCH_CONCURRENCY": "1,2",
            "EAGLENEST_BENCH_MAX_TOKENS": "4"},
        OptimizationConfigs=[{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
        OutputConfig={"S3OutputLocation": "s3://output/jobs/"},
        StoppingCondition={"MaxRuntimeInSeconds": 600})
    arn = _arn("optimization-job", name)
    seen: set[tuple[str, int]] = set()
    deadline = time.monotonic() + 300
    while (job := sm.describe_optimization_job(OptimizationJobName=name))[
            "OptimizationJobStatus"] not in ("COMPLETED", "FAILED", "STOPPED"):
        seen |= {(h, i) for h, i, holder, *_ in _holdings(stack) if holder == arn}
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    assert job["OptimizationJobStatus"] == "COMPLETED", job.get("FailureReason")
    assert len(seen) == 1, seen  # one GPU of one host, held for the whole run
    assert not [h for h in _holdings(stack) if h[2] == arn]

    # The job's work folder (<data>/jobs/<account>/<name>, its servers' --model <work>/model)
    # is gone with the job; the stand-in recorded the runs in the folder above it.
    model = stack.data_dir / "jobs" / ACCOUNT / name / "model"
    files = sorted(stack.data_dir.glob(f"**/{RUNS_FILE}"))
    runs = [r for f in files for r in read_runs(f, model)]
    starts = {r["pid"]: r for r in runs if r["event"] == "start"}
    stops = {r["pid"]: r for r in runs if r["event"] == "stop"}
    assert len(starts) == (1 + len(ks)) * rounds, runs
    assert set(stops) == set(starts), runs  # each stopped cleanly (SIGTERM, exit 0)
    order = sorted(starts, key=lambda pid: starts[pid]["time"])
    spans = [(starts[pid]["time"], stops[pid]["time"]) for pid in order]
    for (_, stop), (start, _) in zip(spans, spans[1:], strict=False):
        assert stop <= start, spans  # never two at once: each stops before the next starts
    # rows in order (baseline, then each K), reversed in the second round
    rows = [None, *ks]
    assert [_speculative_k(starts[pid]["argv"]) for pid in order] == rows + rows[::-1]

    # each planned on the job's one GPU as foundation/memory_plan plans it: the tiny
    # config's 512 positions bound the length (the KV cache holds far more)
    shape = shape_of(eight_b)
    expected = plan(shape, gpus_of_type(lookup("ml.g5.2xlarge")),
                    head=head_estimate(shape, 1, 64))
    assert (expected.tensor_parallel, expected.max_model_len) == (1, 512)
    assert expected.gpu_memory_utilization == 0.9
    for pid in order:
        argv = starts[pid]["argv"]
        assert _flag(argv, "--gpu-memory-utilization") == "0.9", argv
        assert _flag(argv, "--max-model-len") == "512", argv
        assert "--tensor-parallel-size" not in argv, argv

    # the load generator read the stand-in's streamed tokens (choices[0].text, usage)
    report = json.loads((stack.data_dir / "s3" / "output" / "jobs" / name /
                         "benchmark.json").read_text())
    assert list(report["results"]) == ["baseline", *(f"chain K={k}" for k in ks)]
    for levels in report["results"].values():
        assert [r["concurrency"] for r in levels] == [1, 2]
        assert all(r["output_tokens"] > 0 and r["output_throughput"] > 0 for r in levels)


def test_an_endpoint_is_planned_and_a_model_too_big_is_refused(hosts, eight_b, tmp_path):
    """The 8B-shaped model on ml.g5.12xlarge (4 x 24 GiB) serves with the plan's command
    line on host-b: tensor parallel 4 (4 heads, 2 KV heads: replicated evenly), the default
    memory share, the model's own 512 positions. Qwen2.5-14B's 29.5 GB of bfloat16 weights
    (27.5 GiB) cannot fit one A10G: CreateEndpoint refuses it, naming the size."""
    stack, _ = hosts
    sm = stack.client()
    sm.create_model(ModelName="vllm-8b", ExecutionRoleArn=ROLE, PrimaryContainer={
        "Image": "vllm", "Environment": {"EAGLENEST_SERVING_BACKEND": "vllm"},
        "ModelDataSource": {"S3DataSource": {
            "S3Uri": EIGHT_B, "S3DataType": "S3Prefix", "CompressionType": "None"}}})
    sm.create_endpoint_config(
        EndpointConfigName=_config("vllm-8b", "ml.g5.12xlarge"),
        ProductionVariants=[{"VariantName": "AllTraffic", "ModelName": "vllm-8b",
                             "InstanceType": "ml.g5.12xlarge", "InitialInstanceCount": 1}])
    sm.create_endpoint(EndpointName="eight-b",
                       EndpointConfigName=_config("vllm-8b", "ml.g5.12xlarge"))
    d = wait_endpoint(sm, "eight-b", ("InService", "Failed"))
    assert d["EndpointStatus"] == "InService", d.get("FailureReason")
    inst = _instance(stack, "eight-b")
    assert inst["host"] == "host-b" and sorted(inst["gpus"]) == [0, 1, 2, 3]
    expected = plan(shape_of(eight_b), gpus_of_type(lookup("ml.g5.12xlarge")))
    assert (expected.tensor_parallel, expected.gpu_memory_utilization,
            expected.max_model_len) == (4, 0.9, 512)
    cmd, env = _process(inst)
    assert _flag(cmd, "--tensor-parallel-size") == "4", cmd
    assert _flag(cmd, "--gpu-memory-utilization") == "0.9", cmd
    assert _flag(cmd, "--max-model-len") == "512", cmd
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    _delete(sm, "eight-b")

    upload(stack, write_shape(tmp_path / "qwen-14b", "Qwen2.5-14B"), "s3://models/qwen-14b/")
    sm.create_model(ModelName="vllm-14b", ExecutionRoleArn=ROLE, PrimaryContainer={
        "Image": "vllm", "Environment": {"EAGLENEST_SERVING_BACKEND": "vllm"},
        "ModelDataSource": {"S3DataSource": {
            "S3Uri": "s3://models/qwen-14b/", "S3DataType": "S3Prefix",
            "CompressionType": "None"}}})
    sm.create_endpoint_config(
        EndpointConfigName=_config("vllm-14b", "ml.g5.2xlarge"),
        ProductionVariants=[{"VariantName": "AllTraffic", "ModelName": "vllm-14b",
                             "InstanceType": "ml.g5.2xlarge", "InitialInstanceCount": 1}])
    with pytest.raises(ClientError) as refused:
        sm.create_endpoint(EndpointName="fourteen-b",
                           EndpointConfigName=_config("vllm-14b", "ml.g5.2xlarge"))
    error = refused.value.response["Error"]
    assert error["Code"] == "ValidationException", error
    assert "27.5 GiB" in error["Message"], error
    with pytest.raises(ClientError):
        sm.describe_endpoint(EndpointName="fourteen-b")  # no row was written
    assert not [h for h in _holdings(stack) if h[2] == _arn("endpoint", "fourteen-b")]
