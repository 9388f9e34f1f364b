"""Accounts per key: two keys of two accounts on one `eaglenest up`. Every operation of one
account on the other's resources (describe, list, update, delete, stop, tags, the tagging
API, a config or job that names the other's model, an invocation) finds nothing, in both
directions, and changes nothing; `eaglenest keys` creates, lists and revokes keys without a
restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.security.conftest import ROLE, Caller, container, error_of, keys_cli, new_account
from tests.support.jobs import upload
from tests.support.stack import ACCOUNT, Stack


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Caller, Caller]]:
    # API and broker only: endpoints stay Creating, jobs STARTING (nothing to serve/train)
    stack = Stack(tmp_path_factory.mktemp("isolation"),
                  extra_env={"EAGLENEST_WORKER_QUEUES": ""}).start()
    bob = new_account(stack, "bob")
    # bob's model bucket is his by writing into it (naming a bucket claims nothing, and only
    # the default account, alice's, may read a bucket no account owns)
    folder = tmp_path_factory.mktemp("bob-model")
    (folder / "config.json").write_text("{}")
    upload(stack, folder, "s3://bob-models/m/", account=bob.account)
    yield stack, Caller(stack, ACCOUNT), bob
    stack.stop()


def populate(c: Caller, p: str) -> dict[str, str]:
    """A model, endpoint config, endpoint and job named after `p`, each tagged, in buckets of
    `p`'s own (buckets belong to accounts: tests/security/test_buckets.py); their ARNs."""
    tags = [{"Key": "owner", "Value": p}]
    arns = {"model": c.sm.create_model(ModelName=f"{p}-m", ExecutionRoleArn=ROLE, Tags=tags,
                                       PrimaryContainer=container(uri=f"s3://{p}-models/m/"))[
        "ModelArn"]}
    arns["config"] = c.sm.create_endpoint_config(
        EndpointConfigName=f"{p}-c", Tags=tags, ProductionVariants=[{
            "VariantName": "AllTraffic", "ModelName": f"{p}-m",
            "InstanceType": "ml.g5.2xlarge", "InitialInstanceCount": 1}])["EndpointConfigArn"]
    arns["endpoint"] = c.sm.create_endpoint(EndpointName=f"{p}-e", EndpointConfigName=f"{p}-c",
                                            Tags=tags)["EndpointArn"]
    arns["job"] = c.sm.create_optimization_job(**job(f"{p}-j", f"{p}-m", f"{p}-out"),
                                               Tags=tags)["OptimizationJobArn"]
    for arn in arns.values():
        assert f":{c.account}:" in arn, arn
    return arns


def job(name: str, model: str, bucket: str = "out") -> dict[str, Any]:
    return {"OptimizationJobName": name, "RoleArn": ROLE,
            "ModelSource": {"SageMakerModel": {"ModelName": model}},
            "DeploymentInstanceType": "ml.g5.2xlarge",
            "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
            "OutputConfig": {"S3OutputLocation": f"s3://{bucket}/{name}/"},
            "StoppingCondition": {"MaxRuntimeInSeconds": 60}}


def fails(call: Any, code: str, text: str, **kw: Any) -> None:
    with pytest.raises(ClientError) as exc:
        call(**kw)
    got, message = error_of(exc)
    assert got == code and text in message, (got, message)


def assert_invisible(other: Caller, p: str, arns: dict[str, str]) -> None:
    """`other` finds nothing of the resources `arns` (named after `p`) and changes nothing."""
    sm, acct = other.sm, other.account
    fails(sm.describe_model, "ValidationException",
          f'Could not find model "arn:aws:sagemaker:us-east-1:{acct}:model/{p}-m"', ModelName=f"{p}-m")
    fails(sm.describe_endpoint_config, "ValidationException", "Could not find endpoint "
          "configuration", EndpointConfigName=f"{p}-c")
    fails(sm.describe_endpoint, "ValidationException", "Could not find endpoint",
          EndpointName=f"{p}-e")
    fails(sm.describe_optimization_job, "ResourceNotFound", "does not exist",
          OptimizationJobName=f"{p}-j")
    assert sm.list_models(NameContains=p)["Models"] == []
    assert sm.list_endpoint_configs(NameContains=p)["EndpointConfigs"] == []
    assert sm.list_endpoints(NameContains=p)["Endpoints"] == []
    assert sm.list_optimization_jobs(NameContains=p)["OptimizationJobSummaries"] == []
    fails(sm.update_endpoint, "ValidationException", "Could not find",
          EndpointName=f"{p}-e", EndpointConfigName=f"{p}-c")
    fails(sm.update_endpoint_weights_and_capacities, "ValidationException",
          "Could not find endpoint", EndpointName=f"{p}-e",
          DesiredWeightsAndCapacities=[{"VariantName": "AllTraffic", "DesiredWeight": 2.0}])
    fails(sm.stop_optimization_job, "ResourceNotFound", "does not exist",
          OptimizationJobName=f"{p}-j")
    for arn in arns.values():
        fails(sm.list_tags, "ValidationException", arn, ResourceArn=arn)
        fails(sm.add_tags, "ValidationException", arn, ResourceArn=arn,
              Tags=[{"Key": "owner", "Value": "thief"}])
        fails(sm.delete_tags, "ValidationException", arn, ResourceArn=arn, TagKeys=["owner"])
    seen = [r["ResourceARN"] for r in other.tagging.get_resources()["ResourceTagMappingList"]]
    assert not set(seen) & set(arns.values())
    # a config or a job of its own cannot name the other's model
    fails(sm.create_endpoint_config, "ValidationException", "Could not find model",
          EndpointConfigName=f"{p}-steal", ProductionVariants=[{
              "VariantName": "AllTraffic", "ModelName": f"{p}-m",
              "InstanceType": "ml.g5.2xlarge", "InitialInstanceCount": 1}])
    fails(sm.create_optimization_job, "ValidationException", "Could not find model",
          **job(f"{p}-steal", f"{p}-m"))
    with pytest.raises(ClientError) as exc:
        other.rt.invoke_endpoint(EndpointName=f"{p}-e", Body=b'{"inputs": "hi"}',
                                 ContentType="application/json")
    assert error_of(exc) == ("ValidationError", f"Endpoint {p}-e of account {acct} not found.")
    # deletes last: they must not have removed anything
    fails(sm.delete_endpoint, "ValidationException", "Could not find endpoint",
          EndpointName=f"{p}-e")
    fails(sm.delete_endpoint_config, "ValidationException", "Could not find endpoint "
          "configuration", EndpointConfigName=f"{p}-c")
    fails(sm.delete_model, "ValidationException", "Could not find model", ModelName=f"{p}-m")
    fails(sm.delete_optimization_job, "ResourceNotFound", "does not exist",
          OptimizationJobName=f"{p}-j")


def assert_intact(owner: Caller, p: str, arns: dict[str, str]) -> None:
    sm = owner.sm
    assert sm.describe_model(ModelName=f"{p}-m")["ModelArn"] == arns["model"]
    assert sm.describe_endpoint_config(EndpointConfigName=f"{p}-c")["EndpointConfigArn"] == \
        arns["config"]
    assert sm.describe_endpoint(EndpointName=f"{p}-e")["EndpointStatus"] == "Creating"
    assert sm.describe_optimization_job(OptimizationJobName=f"{p}-j")[
        "OptimizationJobStatus"] == "STARTING"
    for arn in arns.values():
        assert sm.list_tags(ResourceArn=arn)["Tags"] == [{"Key": "owner", "Value": p}]
    assert [m["ModelName"] for m in sm.list_models(NameContains=p)["Models"]] == [f"{p}-m"]


def test_two_accounts_see_nothing_of_each_other(two: tuple[Stack, Caller, Caller]) -> None:
    _, alice, bob = two
    a, b = populate(alice, "alice"), populate(bob, "bob")
    assert_invisible(bob, "alice", a)
    assert_invisible(alice, "bob", b)
    assert_intact(alice, "alice", a)
    assert_intact(bob, "bob", b)


def test_keys_list_and_revoke(two: tuple[Stack, Caller, Caller]) -> None:
    stack, _, bob = two
    listed = keys_cli(stack, "list")
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if x.startswith("bob "))
    assert bob.account in line and "secret" not in listed.stdout.lower()
    key = line.split()[1]
    assert key.startswith("AKIA")
    assert bob.sm.list_models()["Models"] is not None  # works before
    revoked = keys_cli(stack, "revoke", key)
    assert revoked.returncode == 0 and "revoked: bob" in revoked.stdout
    fails(bob.sm.list_models, "UnrecognizedClientException",
          "The security token included in the request is invalid.")
    with pytest.raises(ClientError) as exc:
        bob.rt.invoke_endpoint(EndpointName="bob-e", Body=b"{}", ContentType="application/json")
    assert error_of(exc)[0] == "UnrecognizedClientException"
    mode = Path(stack.data_dir / "credentials").stat().st_mode & 0o777
    assert mode == 0o600
