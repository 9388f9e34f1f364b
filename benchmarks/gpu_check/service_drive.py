"""The GPU check's service section, driven from inside the service's environment (it needs
boto3, which the check's own interpreter may lack): `eaglenest up` on a data dir, the
target uploaded, an optimization job that trains a head on the host's GPU, an endpoint of
the job's output model (embedded backend) that answers an invoke, the serving process seen
on its GPU by nvidia-smi, and the GPU free again after the delete.

    python -m benchmarks.gpu_check.service_drive --model DIR --data-dir DIR --steps N --out F

Writes F (JSON: each step's figures and seconds); exit status 1 when a step failed."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import httpx
from botocore.config import Config

from eaglenest.foundation.host.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
KEY, SECRET = "AKIAGPUCHECK00000001", "gpu-check-secret-0123456789abcdefghij"
ACCOUNT = "111122223333"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/GpuCheck"
TYPE = "ml.g5.2xlarge"  # one GPU of 24 GiB: any data-centre GPU of the check holds it
SERVING = {"EAGLENEST_SERVING_BACKEND": "embedded", "EAGLENEST_MAX_MODEL_LEN": "512"}


def _env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLENEST_")}
    env.update(EAGLENEST_DATA_DIR=str(data_dir), EAGLENEST_ACCESS_KEY_ID=KEY,
               EAGLENEST_SECRET_ACCESS_KEY=SECRET, EAGLENEST_ACCOUNT_ID=ACCOUNT,
               PYTHONPATH=f"{ROOT}:{env.get('PYTHONPATH', '')}".rstrip(":"))
    return env


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "eaglenest.cli", *args], env=env,
                          capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"eaglenest {' '.join(args)}: {done.stderr[-2000:]}")
    return done.stdout


def nvidia_pids() -> list[int] | None:
    """The pids nvidia-smi lists as compute processes (None without nvidia-smi)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    text = subprocess.run([exe, "--query-compute-apps=pid", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=60).stdout
    return [int(x) for x in text.split() if x.strip().isdigit()]


def _wait(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.0f} s")
        time.sleep(1)


def _instance_pid(data_dir: Path, endpoint: str) -> int:
    from eaglenest.db.session import Database
    from eaglenest.db.tables import EndpointRow

    db = Database(f"sqlite:///{data_dir / 'eaglenest.db'}")
    try:
        with db.session() as s:
            row = s.query(EndpointRow).filter_by(name=endpoint, account_id=ACCOUNT).one()
            (inst,) = row.deployment["Servers"]["AllTraffic"]["instances"]
            return int(inst["pid"])
    finally:
        db.dispose()


def _job(sm: Any, env: dict[str, str], steps: int, report: dict[str, Any]) -> None:
    t0 = time.monotonic()
    sm.create_optimization_job(
        OptimizationJobName="gpu-check", RoleArn=ROLE,
        ModelSource={"SageMakerModel": {"ModelName": "target"}}, DeploymentInstanceType=TYPE,
        OptimizationEnvironment={
            "EAGLENEST_MAX_STEPS": str(steps), "EAGLENEST_MAX_LENGTH": "256",
            "EAGLENEST_DATASET": "gsm8k_training.jsonl", "EAGLENEST_HOLDOUT": "2",
            "EAGLENEST_BENCHMARK": "0", "EAGLENEST_CHECKPOINT_EVERY": "100000"},
        OptimizationConfigs=[{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
        OutputConfig={"S3OutputLocation": "s3://output/", "SageMakerModel": {
            "ModelName": "target-eagle"}},
        StoppingCondition={"MaxRuntimeInSeconds": 3600})
    placed: set[str] = set()

    def done() -> dict[str, Any] | None:
        placed.update(x.strip() for x in _cli(env, "status").splitlines()
                      if "GPU" in x and "optimization-job/gpu-check" in x)
        d = sm.describe_optimization_job(OptimizationJobName="gpu-check")
        return d if d["OptimizationJobStatus"] in ("COMPLETED", "FAILED", "STOPPED") else None

    d = _wait("job end", done, 3600)
    report["job"] = {"status": d["OptimizationJobStatus"], "reason": d.get("FailureReason"),
                     "seconds": time.monotonic() - t0, "gpus_held": sorted(placed)}
    if d["OptimizationJobStatus"] != "COMPLETED":
        raise RuntimeError(f"job {d['OptimizationJobStatus']}: {d.get('FailureReason')}")


def _endpoint(sm: Any, rt: Any, env: dict[str, str], data_dir: Path,
              report: dict[str, Any]) -> None:
    t0 = time.monotonic()
    sm.create_endpoint_config(EndpointConfigName="gpu-check", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "target-eagle", "InstanceType": TYPE,
        "InitialInstanceCount": 1}])
    sm.create_endpoint(EndpointName="gpu-check", EndpointConfigName="gpu-check")
    sm.get_waiter("endpoint_in_service").wait(
        EndpointName="gpu-check", WaiterConfig={"Delay": 2, "MaxAttempts": 450})
    pid = _instance_pid(data_dir, "gpu-check")
    t1 = time.monotonic()
    reply = rt.invoke_endpoint(EndpointName="gpu-check", ContentType="application/json",
                               Body=json.dumps({"inputs": "Natalia sold clips",
                                                "parameters": {"max_new_tokens": 32}}))
    text = json.loads(reply["Body"].read())["generated_text"]
    before = nvidia_pids()
    lines = [x.strip() for x in _cli(env, "status").splitlines() if "endpoint/gpu-check" in x]
    sm.delete_endpoint(EndpointName="gpu-check")
    sm.get_waiter("endpoint_deleted").wait(
        EndpointName="gpu-check", WaiterConfig={"Delay": 1, "MaxAttempts": 300})
    after = _wait("the server's exit from nvidia-smi", lambda: (
        (nvidia_pids() or [0]) if pid not in (nvidia_pids() or []) else None), 60)
    held_after = [x for x in _cli(env, "status").splitlines() if "endpoint/gpu-check" in x]
    report["endpoint"] = {
        "in_service_seconds": t1 - t0, "invoke_seconds": time.monotonic() - t1,
        "generated_chars": len(text), "server_pid": pid, "status_lines": lines,
        "on_gpu_per_nvidia_smi": None if before is None else pid in before,
        "gone_after_delete": None if before is None else pid not in after,
        "held_after_delete": held_after}


def drive(model: Path, data_dir: Path, steps: int) -> dict[str, Any]:
    env, report = _env(data_dir), {"steps": steps, "type": TYPE}
    port = free_port()
    log = open(data_dir.parent / "service-up.log", "ab")  # noqa: SIM115 (the child's)
    up = subprocess.Popen([sys.executable, "-m", "eaglenest.cli", "up", "--port",
                           str(port)], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        _wait("/ping", lambda: _pings(url), 300)
        report["up_seconds"] = time.monotonic() - t0
        # the worker registers its host after the API answers: wait for its line
        report["gpus"] = _wait("the worker's host in `eaglenest status`", lambda: [
            x.strip() for x in _cli(env, "status").splitlines()
            if x.startswith("  ") and "GPU(s)" in x] or None, 120)
        t0 = time.monotonic()
        _cli(env, "s3", "cp", str(model), "s3://models/target/")
        report["upload_seconds"] = time.monotonic() - t0
        cfg = Config(retries={"total_max_attempts": 1})
        sm = boto3.client("sagemaker", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id=KEY, aws_secret_access_key=SECRET, config=cfg)
        rt = boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id=KEY, aws_secret_access_key=SECRET, config=cfg)
        sm.create_model(ModelName="target", ExecutionRoleArn=ROLE, PrimaryContainer={
            "Image": "eaglenest", "Environment": SERVING, "ModelDataSource": {"S3DataSource": {
                "S3Uri": "s3://models/target/", "S3DataType": "S3Prefix",
                "CompressionType": "None"}}})
        _job(sm, env, steps, report)
        _endpoint(sm, rt, env, data_dir, report)
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=120)
        except subprocess.TimeoutExpired:
            up.kill()
        log.close()
    return report


def _pings(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ping", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    try:
        report = drive(args.model, args.data_dir, args.steps)
        report["ok"] = True
    except Exception as exc:  # recorded: the check reports it as the section's error
        report = {**report, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    args.out.write_text(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
