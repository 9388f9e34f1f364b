"""Optimization jobs against a running stack: a model folder into its artifact store, a
CreateOptimizationJob request for a tiny fast job, and waiting for a job's status."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

from tests.support.stack import Stack, wait_described

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"
ROOT = Path(__file__).resolve().parents[2]


def upload(stack: Stack, src: Path, dst: str, account: str | None = None) -> None:
    """`eaglenest s3 cp` as `account`, by default the stack's (the one its test key acts for)."""
    env = {**os.environ, "EAGLENEST_DATA_DIR": str(stack.data_dir),
           "EAGLENEST_ACCOUNT_ID": account or stack.env()["EAGLENEST_ACCOUNT_ID"]}
    env.pop("EAGLENEST_S3_ENDPOINT_URL", None)
    r = subprocess.run([sys.executable, "-m", "eaglenest.cli", "s3", "cp", str(src), dst],
                       env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def job(model_uri: str, output_model: str | None = None, **env: str) -> dict:
    """CreateOptimizationJob arguments; `output_model` names the SageMaker model to register
    (a name may be registered once: CreateOptimizationJob refuses a taken one)."""
    args = {
        "RoleArn": ROLE, "ModelSource": {"S3": {"S3Uri": model_uri}},
        "DeploymentInstanceType": "ml.g5.2xlarge",
        "OptimizationEnvironment": {
            # tests train the steps they ask for, on the data as written
            "EAGLENEST_MAX_STEPS": "4", "EAGLENEST_MAX_LENGTH": "192",
            "EAGLENEST_REGENERATE": "0", "EAGLENEST_PLATEAU_EVALS": "0",
            "EAGLENEST_MAX_TRAIN_MINUTES": "0",
            "EAGLENEST_DATASET": "gsm8k_training.jsonl", "EAGLENEST_HOLDOUT": "2",
            "EAGLENEST_BENCH_CONCURRENCY": "1,2", "EAGLENEST_BENCH_MAX_TOKENS": "8",
            "EAGLENEST_BENCH_KS": "3", "EAGLENEST_BENCH_DECODINGS": "chain",
            "EAGLENEST_BENCH_MAX_ROUNDS": "2",
            "EAGLENEST_SERVING_BACKEND": "embedded", "EAGLENEST_NUM_SPECULATIVE_TOKENS": "3",
            **env,
        },
        "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
        "OutputConfig": {"S3OutputLocation": "s3://output/jobs/"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 1800},
    }
    if output_model:
        args["OutputConfig"]["SageMakerModel"] = {"ModelName": output_model}
    return args


def wait_status(sm: Any, name: str, want: Collection[str], timeout: float = 300,
                stack: Stack | None = None) -> dict[str, Any]:
    """DescribeOptimizationJob of `name` once its status is one of `want`."""
    return wait_described(lambda: sm.describe_optimization_job(OptimizationJobName=name),
                          "OptimizationJobStatus", want, timeout, stack)
