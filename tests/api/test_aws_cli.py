"""The AWS CLI, unmodified but for --endpoint-url, against the running stack."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"


def aws(stack, *args: str) -> subprocess.CompletedProcess[str]:
    from benchmarks.stack import ACCESS_KEY, REGION, SECRET_KEY

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
               AWS_DEFAULT_REGION=REGION, AWS_MAX_ATTEMPTS="1")
    exe = shutil.which("aws")
    cmd = [exe] if exe else [sys.executable, "-m", "awscli"]
    return subprocess.run([*cmd, "sagemaker", *args, "--endpoint-url", stack.url,
                           "--output", "json"], env=env, capture_output=True, text=True,
                          timeout=120)


def test_cli_create_list_describe(stack, unique):
    r = aws(stack, "create-model", "--model-name", unique, "--execution-role-arn", ROLE,
            "--primary-container", json.dumps({"Image": "lmi:latest"}))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ModelArn"].endswith(f":model/{unique.lower()}")
    r = aws(stack, "list-models", "--name-contains", unique)
    assert r.returncode == 0, r.stderr
    assert [m["ModelName"] for m in json.loads(r.stdout)["Models"]] == [unique]
    r = aws(stack, "describe-model", "--model-name", unique)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["PrimaryContainer"] == {"Image": "lmi:latest"}


def test_cli_reports_aws_errors(stack):
    r = aws(stack, "describe-model", "--model-name", "missing-model")
    assert r.returncode != 0
    assert "ValidationException" in r.stderr
    assert "Could not find model" in r.stderr
    r = aws(stack, "describe-optimization-job", "--optimization-job-name", "nope")
    assert r.returncode != 0
    assert "ResourceNotFound" in r.stderr


@pytest.mark.parametrize(("op", "key"), [("list-endpoints", "Endpoints"),
                                         ("list-endpoint-configs", "EndpointConfigs"),
                                         ("list-optimization-jobs", "OptimizationJobSummaries")])
def test_cli_lists(stack, op, key):
    r = aws(stack, op, "--max-results", "5")
    assert r.returncode == 0, r.stderr
    assert isinstance(json.loads(r.stdout)[key], list)
    r = aws(stack, op, "--max-results", "101")
    assert r.returncode != 0
    assert "ValidationException" in r.stderr and "less than or equal to 100" in r.stderr
