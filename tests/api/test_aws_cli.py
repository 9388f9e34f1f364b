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
    from tests.support.stack import ACCESS_KEY, REGION, SECRET_KEY

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


def test_cli_update_endpoint_weights_and_capacities(stack, unique):
    from eaglenest.db import endpoints_repo
    from eaglenest.db.session import Database

    variant = {"VariantName": "AllTraffic", "ModelName": unique,
               "InstanceType": "ml.g5.2xlarge", "InitialInstanceCount": 1}
    for args in (("create-model", "--model-name", unique, "--execution-role-arn", ROLE,
                  "--primary-container", json.dumps({"Image": "lmi"})),
                 ("create-endpoint-config", "--endpoint-config-name", unique,
                  "--production-variants", json.dumps([variant])),
                 ("create-endpoint", "--endpoint-name", unique, "--endpoint-config-name",
                  unique)):
        r = aws(stack, *args)
        assert r.returncode == 0, r.stderr
    db = Database(stack.database_url)
    with db.session() as s:  # as a serve worker would (tests/workers serve for real)
        endpoints_repo.mark_in_service(s, unique, {"ProductionVariants": [{
            "VariantName": "AllTraffic", "CurrentWeight": 1.0, "DesiredWeight": 1.0,
            "CurrentInstanceCount": 1, "DesiredInstanceCount": 1}]})
    db.dispose()
    r = aws(stack, "update-endpoint-weights-and-capacities", "--endpoint-name", unique,
            "--desired-weights-and-capacities",
            "VariantName=AllTraffic,DesiredWeight=2,DesiredInstanceCount=2")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["EndpointArn"].endswith(f":endpoint/{unique.lower()}")
    r = aws(stack, "describe-endpoint", "--endpoint-name", unique)
    d = json.loads(r.stdout)
    assert d["EndpointStatus"] == "Updating"
    assert d["ProductionVariants"][0]["DesiredWeight"] == 2.0
    assert d["ProductionVariants"][0]["DesiredInstanceCount"] == 2
