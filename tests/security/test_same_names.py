"""Names are per account, as in AWS: two accounts on one `eaglenest up` (serve and train
workers) each create a model, endpoint config, endpoint and optimization job of the SAME
names. Both endpoints serve, each from its own account's model (two tiny models with
different weights: the answers differ) and its own files; deleting one leaves the other
serving; both jobs complete into their own output locations. One account still cannot
create a second resource of a name it has."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.security.conftest import (
    ROLE,
    SERVING_ENV,
    Caller,
    container,
    deploy,
    error_of,
    new_account,
)
from tests.support.jobs import job, upload, wait_status
from tests.support.stack import ACCOUNT, Stack

NAME = "same"  # every resource of both accounts
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path
         ) -> Iterator[tuple[Stack, Caller, Caller]]:
    """The stack, alice (the default account) and bob; each account's tiny model in a
    bucket of its own (bob's has other random weights)."""
    from eaglenest.models.tiny import build_tiny_target

    stack = Stack(tmp_path_factory.mktemp("same-names")).start()
    other = build_tiny_target(tmp_path_factory.mktemp("tiny-b") / "llama", "LlamaForCausalLM",
                              seed=1)
    bob = new_account(stack, "bob")
    upload(stack, tiny_llama_dir, "s3://alice-models/tiny/")
    upload(stack, other, "s3://bob-models/tiny/", account=bob.account)
    yield stack, Caller(stack, ACCOUNT), bob
    stack.stop()


def model_uri(c: Caller) -> str:
    return "s3://alice-models/tiny/" if c.account == ACCOUNT else "s3://bob-models/tiny/"


def gone(c: Caller) -> str:
    """A prefix of the account's bucket with nothing in it."""
    return model_uri(c).replace("/tiny/", "/nothing-here/")


def answer(c: Caller) -> str:
    r = c.rt.invoke_endpoint(EndpointName=NAME, ContentType="application/json", Body=json.dumps(
        {"inputs": PROMPT, "parameters": {"max_new_tokens": 8, "temperature": 0}}))
    return str(json.loads(r["Body"].read())["generated_text"])


def wait_in_service(c: Caller) -> None:
    c.sm.get_waiter("endpoint_in_service").wait(
        EndpointName=NAME, WaiterConfig={"Delay": 1, "MaxAttempts": 300})


def pids(stack: Stack, account: str) -> list[int]:
    from eaglenest.foundation.deployment import instances_of

    servers = stack.deployment(NAME, account)["Servers"]
    return [int(i["pid"]) for rec in servers.values() for i in instances_of(rec)]


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_same_names_in_two_accounts_serve_their_own_models(
        pair: tuple[Stack, Caller, Caller]) -> None:
    stack, alice, bob = pair
    arns = {}
    for c in (alice, bob):
        # each account's own Environment, to tell its model apart in Describe
        env = {**SERVING_ENV, "EAGLENEST_EXPECTED_CONCURRENCY": str(len(arns) + 1)}
        arns[c.account] = c.sm.create_model(ModelName=NAME, ExecutionRoleArn=ROLE,
                                            PrimaryContainer=container(env, model_uri(c)))
        deploy(c.sm, NAME, NAME)
    assert arns[ACCOUNT]["ModelArn"] != arns[bob.account]["ModelArn"]
    for c in (alice, bob):
        wait_in_service(c)
        env = c.sm.describe_model(ModelName=NAME)["PrimaryContainer"]["Environment"]
        assert env["EAGLENEST_EXPECTED_CONCURRENCY"] == ("1" if c is alice else "2")
        assert c.sm.describe_endpoint(EndpointName=NAME)["EndpointArn"] == \
            f"arn:aws:sagemaker:us-east-1:{c.account}:endpoint/{NAME}"
    first = {c.account: answer(c) for c in (alice, bob)}
    assert first[ACCOUNT] != first[bob.account]  # two models, not one answering for both
    for c in (alice, bob):
        assert answer(c) == first[c.account]
        assert (stack.data_dir / "endpoints" / c.account / NAME).is_dir()
    theirs = pids(stack, bob.account)
    assert not set(theirs) & set(pids(stack, ACCOUNT))

    alice.sm.delete_endpoint(EndpointName=NAME)
    alice.sm.get_waiter("endpoint_deleted").wait(
        EndpointName=NAME, WaiterConfig={"Delay": 1, "MaxAttempts": 120})
    assert not (stack.data_dir / "endpoints" / ACCOUNT / NAME).exists()
    assert bob.sm.describe_endpoint(EndpointName=NAME)["EndpointStatus"] == "InService"
    assert all(alive(p) for p in theirs)
    assert answer(bob) == first[bob.account]
    assert (stack.data_dir / "endpoints" / bob.account / NAME).is_dir()
    with pytest.raises(ClientError) as exc:
        answer(alice)
    assert error_of(exc) == ("ValidationError",
                             f"Endpoint {NAME} of account {ACCOUNT} not found.")


def test_same_job_names_complete_into_their_own_outputs(
        pair: tuple[Stack, Caller, Caller]) -> None:
    stack, alice, bob = pair
    outputs = {ACCOUNT: "s3://alice-out/jobs/", bob.account: "s3://bob-out/jobs/"}
    for c in (alice, bob):
        args = job(model_uri(c), EAGLENEST_BENCHMARK="0", EAGLENEST_MAX_STEPS="2")
        args["OutputConfig"]["S3OutputLocation"] = outputs[c.account]
        c.sm.create_optimization_job(OptimizationJobName=NAME, **args)
    for c in (alice, bob):
        d = wait_status(c.sm, NAME, {"COMPLETED", "FAILED", "STOPPED"}, timeout=600)
        assert d["OptimizationJobStatus"] == "COMPLETED", d.get("FailureReason")
        assert d["OptimizationJobArn"] == \
            f"arn:aws:sagemaker:us-east-1:{c.account}:optimization-job/{NAME}"
    for c in (alice, bob):
        bucket = outputs[c.account].split("/")[2]
        out = stack.data_dir / "s3" / bucket / "jobs" / NAME
        provenance = json.loads((out / "provenance.json").read_text())
        assert provenance["sources"]["model_uri"] == model_uri(c), provenance
        assert (out / "eagle_model" / "model.safetensors").is_file()
        assert not (stack.data_dir / "jobs" / c.account / NAME).exists()  # work dir cleaned


def own_job(c: Caller, model: str) -> dict[str, Any]:
    """CreateOptimizationJob arguments writing to a bucket of `c`'s own account."""
    args = job(model)
    args["OutputConfig"]["S3OutputLocation"] = model_uri(c).replace("-models/tiny/", "-out/dup/")
    return args


def test_one_account_cannot_reuse_a_name(pair: tuple[Stack, Caller, Caller]) -> None:
    """Both accounts have a model, config, endpoint and job `dup` (on a model that does not
    exist: they fail fast); a second one of any case in one account is refused with AWS's
    message and changes nothing."""
    _, alice, bob = pair
    for c in (alice, bob):
        c.sm.create_model(ModelName="dup", ExecutionRoleArn=ROLE,
                          PrimaryContainer=container(uri=gone(c)))
        deploy(c.sm, "dup", "dup")
        c.sm.create_optimization_job(OptimizationJobName="dup", **own_job(c, gone(c)))
    arn = f"arn:aws:sagemaker:us-east-1:{bob.account}"
    variant = {"VariantName": "AllTraffic", "ModelName": "dup", "InstanceType": "ml.g5.2xlarge"}
    refused: list[tuple[Any, dict[str, Any], str, str]] = [
        (bob.sm.create_model, {"ModelName": "DUP", "ExecutionRoleArn": ROLE,
                               "PrimaryContainer": container(uri=gone(bob))},
         "ValidationException", f'Cannot create already existing model "{arn}:model/dup".'),
        (bob.sm.create_endpoint_config, {"EndpointConfigName": "Dup",
                                         "ProductionVariants": [variant]},
         "ValidationException", "Cannot create already existing endpoint configuration "
                                f'"{arn}:endpoint-config/dup".'),
        (bob.sm.create_endpoint, {"EndpointName": "dUP", "EndpointConfigName": "dup"},
         "ValidationException", f'Cannot create already existing endpoint "{arn}:endpoint/dup".'),
        (bob.sm.create_optimization_job, {"OptimizationJobName": "dup",
                                          **own_job(bob, "s3://bob-models/tiny/")},
         "ResourceInUse", "Optimization job dup already exists."),
    ]
    for call, kw, code, message in refused:
        with pytest.raises(ClientError) as exc:
            call(**kw)
        assert error_of(exc) == (code, message)
    for c in (alice, bob):
        model = c.sm.describe_model(ModelName="dup")
        assert model["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]["S3Uri"] == gone(c)
        assert model["ModelArn"].split(":")[4] == c.account
        d = wait_status(c.sm, "dup", {"FAILED", "COMPLETED", "STOPPED"})
        assert d["ModelSource"]["S3"]["S3Uri"] == gone(c)
        c.sm.delete_endpoint(EndpointName="dup")
