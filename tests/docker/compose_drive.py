"""Drive the docker compose stack that scripts/compose_check.sh brought up (issue #24).

Everything goes through boto3 against the API container (and the S3 container for the
uploads), as a user would; what the containers did is read from their own logs
(EAGLENEST_LOG_FORMAT=json) and from `docker inspect`. Run with the test venv:

    python tests/docker/compose_drive.py --project eaglenest \
        -f docker-compose.yml -f docker/compose.ci.yml

The stack runs with two train workers (`--scale worker-train=2`). In order:
  1. migrate ran once, exited 0, and finished before the API and every worker started;
     every worker's Celery node came up;
  2. a tiny random Llama target (eaglenest.models.tiny) is uploaded and registered
     (CreateModel), and a tiny optimization job (two training steps, benchmark on the
     embedded engine) runs on a train worker container to COMPLETED;
  3. its output model is deployed (embedded backend) on the serve worker container to
     InService, then invoked and streamed;
  4. the training pace is measured (a 10-step job), then a longer job: while one train
     container trains it, `docker-compose restart postgres` and `restart redis`, and the
     container trains on through both; then that container is `docker kill`ed; the other
     resumes the job from its last checkpoint; it completes exactly once, every training
     step logged exactly once; the endpoint still answers afterwards.
Exits non-zero (an AssertionError naming the check) on the first failure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

ROOT = Path(__file__).resolve().parents[2]
API = os.environ.get("COMPOSE_CHECK_API", "http://127.0.0.1:8080")
S3 = os.environ.get("COMPOSE_CHECK_S3", "http://127.0.0.1:9000")
ROLE = "arn:aws:iam::000000000000:role/EagleNest"
# tests/benchmarks/test_readme_walkthrough.py's TINY_OPTIONS: a tiny model, two training steps
TINY_OPTIONS = {
    "EAGLENEST_MAX_STEPS": "2", "EAGLENEST_MAX_LENGTH": "192", "EAGLENEST_HOLDOUT": "2",
    "EAGLENEST_DATASET": "gsm8k_training.jsonl", "EAGLENEST_BENCH_CONCURRENCY": "1",
    "EAGLENEST_BENCH_MAX_TOKENS": "8", "EAGLENEST_SERVING_BACKEND": "embedded",
    "EAGLENEST_NUM_SPECULATIVE_TOKENS": "3",
    # the benchmark's rows: chain K=1, 3 in two rounds (a tiny model's timing noise would
    # otherwise add rounds, and the default decodings servers)
    "EAGLENEST_BENCH_DECODINGS": "chain", "EAGLENEST_BENCH_MAX_ROUNDS": "2",
    # the data as written, and exactly the steps asked for (no plateau or time budget stop)
    "EAGLENEST_REGENERATE": "0", "EAGLENEST_PLATEAU_EVALS": "0", "EAGLENEST_MAX_TRAIN_MINUTES": "0"}
SERVING = {"EAGLENEST_SERVING_BACKEND": "embedded", "EAGLENEST_NUM_SPECULATIVE_TOKENS": "3",
           "EAGLENEST_MAX_MODEL_LEN": "512"}
#: training steps of the job that is killed and resumed (default: from the measured pace)
RESUME_STEPS = int(os.environ.get("COMPOSE_CHECK_RESUME_STEPS", "0"))  # 0: from the pace
LEASE = float(os.environ.get("EAGLENEST_JOB_LEASE_SECONDS", "60"))
START = time.monotonic()


def say(msg: str) -> None:
    print(f"[drive {time.monotonic() - START:6.1f}s] {msg}", flush=True)


def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 1.0) -> Any:
    """Poll `check` until it returns something truthy. Errors from a service that is
    restarting (connection refused, 503) count as "not yet"."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            result = check()
            if result:
                return result
            last = result
        except (BotoCoreError, ClientError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} "
                                 f"(last: {last!r})")
        time.sleep(every)


def parse_time(text: str) -> datetime:
    """Docker's RFC 3339 times with nanoseconds -> datetime (microseconds)."""
    main, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{main}.{(frac + '000000')[:6]}+00:00")


class Compose:
    def __init__(self, project: str, files: list[str]) -> None:
        self.project = project
        self.base = ["docker-compose", "-p", project]
        for f in files:
            self.base += ["-f", f]

    def run(self, *args: str) -> str:
        r = subprocess.run([*self.base, *args], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, f"docker-compose {' '.join(args)}: {r.stderr[-2000:]}"
        return r.stdout

    def containers(self, service: str) -> list[str]:
        r = subprocess.run(
            ["docker", "ps", "-a", "--format", "{{.Names}}",
             "--filter", f"label=com.docker.compose.project={self.project}",
             "--filter", f"label=com.docker.compose.service={service}"],
            capture_output=True, text=True, check=True)
        return sorted(r.stdout.split())

    @staticmethod
    def inspect(name: str) -> dict[str, Any]:
        r = subprocess.run(["docker", "inspect", name], capture_output=True, text=True,
                           check=True)
        return json.loads(r.stdout)[0]  # type: ignore[no-any-return]

    @staticmethod
    def messages(name: str) -> list[str]:
        """The `message` of every JSON log line the container wrote (other lines as is)."""
        r = subprocess.run(["docker", "logs", name], capture_output=True, text=True,
                           check=True)
        out = []
        for line in (r.stdout + r.stderr).splitlines():
            try:
                out.append(str(json.loads(line)["message"]))
            except (ValueError, KeyError, TypeError):
                out.append(line)
        return out

    @staticmethod
    def entries(name: str) -> list[tuple[datetime, str]]:
        """(ts, message) of every JSON log line the container wrote."""
        r = subprocess.run(["docker", "logs", name], capture_output=True, text=True,
                           check=True)
        out = []
        for line in (r.stdout + r.stderr).splitlines():
            try:
                entry = json.loads(line)
                out.append((parse_time(entry["ts"]), str(entry["message"])))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def healthy(self, service: str) -> bool:
        names = self.containers(service)
        return bool(names) and all(
            (self.inspect(n)["State"].get("Health") or {}).get("Status") == "healthy"
            for n in names)


def clients() -> tuple[Any, Any, Any]:
    region = os.environ.get("EAGLENEST_REGION", "us-east-1")
    config = Config(retries={"mode": "standard", "max_attempts": 5}, read_timeout=120)
    keys = {"aws_access_key_id": os.environ["EAGLENEST_ACCESS_KEY_ID"],
            "aws_secret_access_key": os.environ["EAGLENEST_SECRET_ACCESS_KEY"]}
    sm = boto3.client("sagemaker", endpoint_url=API, region_name=region, config=config, **keys)
    rt = boto3.client("sagemaker-runtime", endpoint_url=API, region_name=region,
                      config=config, **keys)
    s3 = boto3.client("s3", endpoint_url=S3, region_name=region, config=config,
                      aws_access_key_id=os.environ["MINIO_ROOT_USER"],
                      aws_secret_access_key=os.environ["MINIO_ROOT_PASSWORD"])
    return sm, rt, s3


def job_spec(name: str, options: dict[str, str], output_model: str | None) -> dict[str, Any]:
    output: dict[str, Any] = {"S3OutputLocation": "s3://output/"}
    if output_model:
        output["SageMakerModel"] = {"ModelName": output_model}
    return {"OptimizationJobName": name, "RoleArn": ROLE,
            "ModelSource": {"SageMakerModel": {"ModelName": "tiny"}},
            "DeploymentInstanceType": "ml.g5.2xlarge", "OptimizationEnvironment": options,
            "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
            "OutputConfig": output, "StoppingCondition": {"MaxRuntimeInSeconds": 3600}}


def job_status(sm: Any, name: str) -> str:
    return str(sm.describe_optimization_job(OptimizationJobName=name)["OptimizationJobStatus"])


def wait_job_done(sm: Any, name: str, timeout: float) -> dict[str, Any]:
    d = wait_for(f"job {name} to end", lambda: (
        (x := sm.describe_optimization_job(OptimizationJobName=name))
        ["OptimizationJobStatus"] in ("COMPLETED", "FAILED", "STOPPED") and x), timeout, 2)
    assert d["OptimizationJobStatus"] == "COMPLETED", (name, d.get("FailureReason"))
    return d  # type: ignore[no-any-return]


def runners(stack: Compose, job: str) -> dict[str, int]:
    """Train containers -> how many times each claimed `job` (from their logs)."""
    claim = f"job {job} claimed by worker "
    return {c: sum(m.startswith(claim) for m in stack.messages(c))
            for c in stack.containers("worker-train")}


def check_migrate_once(stack: Compose) -> None:
    migrate = stack.containers("migrate")
    assert len(migrate) == 1, f"migrate ran in {migrate}"
    state = stack.inspect(migrate[0])["State"]
    assert state["Status"] == "exited" and state["ExitCode"] == 0, state
    assert stack.inspect(migrate[0])["RestartCount"] == 0
    assert stack.messages(migrate[0]).count("database is at head") == 1
    finished = parse_time(state["FinishedAt"])
    for service in ("api", "worker-train", "worker-serve"):
        for c in stack.containers(service):
            started = parse_time(stack.inspect(c)["State"]["StartedAt"])
            assert started >= finished, f"{c} started {started} before migrate ended {finished}"


def upload_tiny_model(s3: Any) -> None:
    from eaglenest.models.tiny import build_tiny_target

    with tempfile.TemporaryDirectory() as tmp:
        folder = build_tiny_target(Path(tmp) / "llama", "LlamaForCausalLM")
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        for f in files:
            s3.upload_file(str(f), "models", f"tiny/{f.relative_to(folder).as_posix()}")
    say(f"uploaded the tiny Llama target: {len(files)} files under s3://models/tiny/")


def invoke(rt: Any, endpoint: str) -> str:
    r = rt.invoke_endpoint(EndpointName=endpoint, ContentType="application/json", Body=json.dumps(
        {"inputs": "Natalia sold 48 clips", "parameters": {"max_new_tokens": 8}}))
    text = json.loads(r["Body"].read())["generated_text"]
    assert isinstance(text, str), text
    return text


def stream(rt: Any, endpoint: str) -> list[bytes]:
    s = rt.invoke_endpoint_with_response_stream(
        EndpointName=endpoint, ContentType="application/json",
        Body=json.dumps({"inputs": "What is 12*7?", "parameters": {"max_new_tokens": 8}}))
    parts = [e["PayloadPart"]["Bytes"] for e in s["Body"] if "PayloadPart" in e]
    assert parts, "the stream carried no payload"
    for line in b"".join(parts).splitlines():
        if line.strip():
            assert "token" in json.loads(line), line  # LMI stream: {"token": {"text": ...}}
    return parts


def pace(stack: Compose, sm: Any) -> float:
    """Training steps per second on a train container now, once training runs: a 40-step
    job, timed from its container's log between its first and last progress lines (the
    target's loading and the first steps' warm-up, several times slower, left out: timed
    from the 'train' stage they made the resume job end before its restarts)."""
    job, steps = "compose-pace", 40
    options = {**TINY_OPTIONS, "EAGLENEST_MAX_STEPS": str(steps), "EAGLENEST_MAX_LENGTH": "128",
               "EAGLENEST_CHECKPOINT_EVERY": "0", "EAGLENEST_BENCHMARK": "0"}
    sm.create_optimization_job(**job_spec(job, options, None))
    wait_job_done(sm, job, 600)
    ran = [c for c, n in runners(stack, job).items() if n]
    marks = [(int(m.split()[3].split("/")[0]), ts) for ts, m in stack.entries(ran[0])
             if m.startswith(f"job {job}: step ") and "/" in m.split()[3]]
    assert len(marks) >= 2, f"{job}: fewer than two progress lines in {ran[0]}'s log"
    (first, began), (last, ended) = marks[0], marks[-1]
    return (last - first) / max((ended - began).total_seconds(), 0.01)


def lost_worker(job: str, message: str) -> bool:
    """A reconciler's "job <ARN> lost its worker; ..." line about `job` (the ARN ends in
    `optimization-job/<name>`)."""
    words = message.split(" ")
    return (len(words) > 4 and words[0] == "job" and words[1].rsplit("/", 1)[-1] == job
            and message.startswith(f"job {words[1]} lost its worker"))


def resume_after_kill(stack: Compose, sm: Any, s3: Any, rate: float) -> None:
    """The restarts while one train container trains the job, then that container killed:
    the other resumes it from its last checkpoint and completes it, exactly once."""
    job = "compose-resume"
    # enough steps for ~60 s of training at the measured pace: the first checkpoint, both
    # restarts (~20 s) and the kill all happen before the job could end
    steps = RESUME_STEPS or max(30, min(3000, round(rate * 60)))
    options = {**TINY_OPTIONS, "EAGLENEST_MAX_STEPS": str(steps), "EAGLENEST_MAX_LENGTH": "128",
               "EAGLENEST_CHECKPOINT_EVERY": "5", "EAGLENEST_BENCHMARK": "0"}
    sm.create_optimization_job(**job_spec(job, options, None))
    first = wait_for(f"a train container to claim {job}",
                     lambda: [c for c, n in runners(stack, job).items() if n], 180, 0.5)
    assert len(first) == 1, first
    victim = first[0]

    def checkpoint() -> str:
        r = s3.get_object(Bucket="output", Key=f"{job}/_checkpoints/latest")
        return str(r["Body"].read().decode())

    before = wait_for(f"{job}'s first checkpoint", checkpoint, 300, 0.5)
    say(f"{job}: {steps} steps ({rate:.1f} steps/s measured); {victim} trains it, "
        f"checkpoint {before}")
    for service in ("postgres", "redis"):
        t0 = time.monotonic()
        stack.run("restart", service)
        wait_for(f"{service} healthy after its restart", partial(stack.healthy, service), 120)
        say(f"{job}: docker-compose restart {service}: healthy again after "
            f"{time.monotonic() - t0:.0f} s")
    status = wait_for(f"the API to answer for {job}", lambda: job_status(sm, job), 120)
    assert status == "INPROGRESS", (
        f"{job} was {status} once postgres and redis were back: the restarts did not happen "
        f"mid-job (set COMPOSE_CHECK_RESUME_STEPS above {steps})")
    after = wait_for(f"a checkpoint after the restarts (last: {before})",
                     lambda: (c := checkpoint()) != before and c, 120, 0.5)
    lost = [c for c in stack.containers("worker-train")
            if any(lost_worker(job, m) for m in stack.messages(c))]
    assert not lost, f"{job} was taken from {victim} during the restarts ({lost})"
    say(f"{job}: {victim} trained on through both restarts (checkpoint {after})")

    subprocess.run(["docker", "kill", victim], check=True, capture_output=True)
    killed_at = time.monotonic()
    assert job_status(sm, job) == "INPROGRESS", f"{job} ended before the kill: raise its steps"
    say(f"{job}: docker kill {victim}")

    def resumed() -> list[str]:
        return [c for c, n in runners(stack, job).items() if n and c != victim]

    survivor = wait_for(f"another train container to resume {job}", resumed,
                        3 * LEASE + 120)[0]
    resumed_after = time.monotonic() - killed_at
    # any worker's watchdog (train or serve) may be the one that found the job ownerless
    workers = [*stack.containers("worker-train"), *stack.containers("worker-serve")]
    noticed = [c for c in workers if c != victim and any(
        lost_worker(job, m) for m in stack.messages(c))]
    assert noticed, f"no worker logged that {job} lost its worker"
    say(f"{job}: {noticed[0]} found it ownerless; resumed by {survivor} {resumed_after:.0f} s "
        f"after the kill")

    wait_job_done(sm, job, 1200)
    body = s3.get_object(Bucket="output", Key=f"{job}/training_log.jsonl")["Body"].read()
    logged = [json.loads(line)["step"] for line in body.decode().splitlines()]
    assert logged == list(range(1, steps + 1)), f"steps logged: {logged[:5]}...{logged[-5:]}"
    done = {c: stack.messages(c).count(f"job {job} COMPLETED")
            for c in stack.containers("worker-train")}
    assert sum(done.values()) == 1 and done[survivor] == 1, f"COMPLETED logged by {done}"
    assert not stack.inspect(victim)["State"]["Running"], f"{victim} came back"
    say(f"{job}: COMPLETED once (on {survivor}), steps 1..{steps} each logged once")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--project", required=True)
    p.add_argument("-f", "--file", action="append", required=True)
    args = p.parse_args()
    stack = Compose(args.project, args.file)
    sm, rt, s3 = clients()

    check_migrate_once(stack)
    trainers = stack.containers("worker-train")
    assert len(trainers) == 2, trainers
    for c in [*trainers, *stack.containers("worker-serve")]:
        assert any(m.endswith(" ready.") for m in stack.messages(c)), f"{c}: no Celery node"
    say("migrate ran once, before the API and the workers; 2 train + 1 serve workers up")

    upload_tiny_model(s3)
    sm.create_model(ModelName="tiny", ExecutionRoleArn=ROLE, PrimaryContainer={
        "Image": "eaglenest", "Environment": SERVING, "ModelDataSource": {"S3DataSource": {
            "S3Uri": "s3://models/tiny/", "S3DataType": "S3Prefix",
            "CompressionType": "None"}}})
    sm.create_optimization_job(**job_spec("compose-tiny", TINY_OPTIONS, "tiny-eagle"))
    wait_job_done(sm, "compose-tiny", 600)
    ran = {c: n for c, n in runners(stack, "compose-tiny").items() if n}
    assert list(ran.values()) == [1], f"compose-tiny claimed by {ran}"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="output", Prefix="compose-tiny/")
            .get("Contents", [])]
    assert "compose-tiny/benchmark.md" in keys, keys
    extra = sm.describe_model(ModelName="tiny-eagle")["PrimaryContainer"][
        "AdditionalModelDataSources"]
    assert extra[0]["ChannelName"] == "eagle_model", extra
    say(f"compose-tiny: COMPLETED on {next(iter(ran))}; tiny-eagle registered with its head")

    sm.create_endpoint_config(EndpointConfigName="compose-ep", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "tiny-eagle", "InstanceType": "ml.g5.2xlarge",
        "InitialInstanceCount": 1, "ContainerStartupHealthCheckTimeoutInSeconds": 300}])
    sm.create_endpoint(EndpointName="compose-ep", EndpointConfigName="compose-ep")
    ep = wait_for("compose-ep to leave Creating", lambda: (
        (d := sm.describe_endpoint(EndpointName="compose-ep"))["EndpointStatus"]
        in ("InService", "Failed") and d), 400, 2)
    assert ep["EndpointStatus"] == "InService", ep.get("FailureReason")
    serve = stack.containers("worker-serve")[0]
    assert any("eaglenest.endpoint.create" in m and "succeeded" in m
               for m in stack.messages(serve)), f"{serve} did not log the endpoint's creation"
    say(f"compose-ep: InService on {serve}; invoke -> {invoke(rt, 'compose-ep')!r}; "
        f"stream -> {len(stream(rt, 'compose-ep'))} parts")

    rate = pace(stack, sm)
    resume_after_kill(stack, sm, s3, rate)
    say(f"compose-ep still answers after the restarts: {invoke(rt, 'compose-ep')!r}")
    check_migrate_once(stack)
    say("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
