"""The whole optimization job on a real target, as a user runs it: `eaglenest up` (API +
Celery worker on the embedded defaults), the model folder uploaded to the artifact store,
CreateModel and CreateOptimizationJob through boto3 (built-in datasets, the SageMaker
"your model + built-in datasets" path), polled to COMPLETED; prints the job's timings and
the benchmark.md it published (baseline vs EAGLE at each concurrency, measured in one run
by the job's own benchmark stage).

    python -m benchmarks.full_job [--target DIR] [--steps 1200] [--backend vllm|embedded]
                                  [--out DIR] [--env NAME=VALUE ...]

--target defaults to the folder `eaglenest prepare-target` writes
(~/.cache/eaglenest/smollm2-135m-instruct). --out keeps a copy of the job's outputs.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.user_stack import UserStack

ROOT = Path(__file__).resolve().parents[1]

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"
DEFAULT_TARGET = Path.home() / ".cache" / "eaglenest" / "smollm2-135m-instruct"


def job_request(name: str, steps: int, backend: str, extra: dict[str, str]) -> dict:
    return {
        "OptimizationJobName": name, "RoleArn": ROLE,
        "ModelSource": {"SageMakerModel": {"ModelName": "target"}},
        "DeploymentInstanceType": "ml.g5.2xlarge",
        "OptimizationEnvironment": {
            "EAGLENEST_MAX_STEPS": str(steps), "EAGLENEST_MAX_LENGTH": "512",
            "EAGLENEST_SERVING_BACKEND": backend, "EAGLENEST_HOLDOUT": "8",
            "EAGLENEST_BENCH_MAX_TOKENS": "96", "EAGLENEST_CHECKPOINT_EVERY": "200",
            **extra},
        "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
        "OutputConfig": {"S3OutputLocation": "s3://output/",
                         "SageMakerModel": {"ModelName": f"{name}-optimized"}},
        "StoppingCondition": {"MaxRuntimeInSeconds": 6 * 3600},
    }


def wait(sm: object, name: str) -> dict:
    last = ""
    while True:
        d = sm.describe_optimization_job(OptimizationJobName=name)  # type: ignore[attr-defined]
        status = d["OptimizationJobStatus"]
        if status != last:
            print(f"{time.strftime('%H:%M:%S')} {status}", flush=True)
            last = status
        if status in {"COMPLETED", "FAILED", "STOPPED"}:
            return dict(d)
        time.sleep(5)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--target", type=Path, default=DEFAULT_TARGET)
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--backend", default="vllm", choices=("vllm", "embedded"))
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--env", action="append", default=[], help="extra NAME=VALUE job option")
    args = p.parse_args()
    extra = dict(e.split("=", 1) for e in args.env)
    tmp = Path(tempfile.mkdtemp(prefix="eaglenest-job-"))
    stack = UserStack(tmp).start()
    try:
        subprocess.run([sys.executable, "-m", "eaglenest.cli", "s3", "cp", str(args.target),
                        "s3://models/target/"], env=stack.env(), check=True, cwd=ROOT)
        sm = stack.client()
        sm.create_model(  # type: ignore[attr-defined]
            ModelName="target", ExecutionRoleArn=ROLE, PrimaryContainer={
                "Image": "eaglenest", "ModelDataSource": {"S3DataSource": {
                    "S3Uri": "s3://models/target/", "S3DataType": "S3Prefix",
                    "CompressionType": "None"}}})
        sm.create_optimization_job(  # type: ignore[attr-defined]
            **job_request("full-job", args.steps, args.backend, extra))
        d = wait(sm, "full-job")
        took = (d["OptimizationEndTime"] - d["OptimizationStartTime"]).total_seconds()
        print(f"status {d['OptimizationJobStatus']} in {took:.0f} s "
              f"{d.get('FailureReason', '')}")
        out = tmp / "s3" / "output" / "full-job"
        if args.out is not None and out.exists():
            shutil.copytree(out, args.out, dirs_exist_ok=True)
        if (out / "benchmark.md").exists():
            print((out / "benchmark.md").read_text())
        return 0 if d["OptimizationJobStatus"] == "COMPLETED" else 1
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
