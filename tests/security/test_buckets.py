"""Buckets belong to accounts, on a real `eaglenest up` with two accounts (alice: the stack's
key, bob: a key of a new account). A Create request of bob's naming one of alice's buckets
anywhere (model data, job input, output, training data, Data Capture, core dumps, async
outputs) is refused with SageMaker's error and creates nothing, claims nothing; alice's own
requests work and claim the buckets they name. `eaglenest s3` acts for one account and is
refused the other's buckets; a job whose bucket changed owner after Create fails with
AccessDenied."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from benchmarks.stack import ACCOUNT, Stack
from tests.security.conftest import ROLE, container, error_of
from tests.security.test_isolation import Caller, keys_cli
from tests.support.jobs import ROOT, wait_status

MODEL_DATA = ("Could not access model data at {uri}. Please ensure that the role \"" + ROLE +
              "\" exists and that its trust relationship policy allows the action "
              "\"sts:AssumeRole\" for the service principal \"sagemaker.amazonaws.com\". Also "
              "ensure that the role has \"s3:GetObject\" permissions and that the object is "
              "located in us-east-1. If your Model uses multiple models or uncompressed "
              "models, please ensure that the role has \"s3:ListBucket\" permission.")


def denied(member: str, uri: str, bucket: str) -> str:
    return f"{member}: Access Denied to {uri}: the bucket '{bucket}' belongs to another account."


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Caller, Caller]]:
    # API and broker only: what is checked here happens before any worker runs
    stack = Stack(tmp_path_factory.mktemp("buckets"),
                  extra_env={"EAGLENEST_WORKER_QUEUES": ""}).start()
    r = keys_cli(stack, "create", "--name", "bob", "--new-account")
    assert r.returncode == 0, r.stderr
    out = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    bob = Caller(stack, out["account"], key=out["access key id"],
                 secret=out["secret access key"])
    bob.key = out["access key id"]  # type: ignore[attr-defined]
    yield stack, Caller(stack, ACCOUNT), bob
    stack.stop()


def owner(stack: Stack, bucket: str) -> str | None:
    path = stack.data_dir / "s3" / ".owners" / bucket
    return path.read_text() if path.exists() else None


def model(name: str, uri: str, **extra: Any) -> dict[str, Any]:
    return {"ModelName": name, "ExecutionRoleArn": ROLE,
            "PrimaryContainer": {**container(uri=uri), **extra}}


def config(name: str, model_name: str, **extra: Any) -> dict[str, Any]:
    return {"EndpointConfigName": name, "ProductionVariants": [{
        "VariantName": "AllTraffic", "ModelName": model_name, "InstanceType": "ml.g5.2xlarge",
        "InitialInstanceCount": 1}], **extra}


def capture(uri: str) -> dict[str, Any]:
    return {"DataCaptureConfig": {"InitialSamplingPercentage": 100, "DestinationS3Uri": uri,
                                  "CaptureOptions": [{"CaptureMode": "Input"}]}}


def job(name: str, model_uri: str, output: str, data: str | None = None) -> dict[str, Any]:
    eagle: dict[str, Any] = {"Technique": "EAGLE"}
    if data:
        eagle["TrainingDataSource"] = {"S3Uri": data, "S3DataType": "S3Prefix"}
    return {"OptimizationJobName": name, "RoleArn": ROLE,
            "ModelSource": {"S3": {"S3Uri": model_uri}},
            "DeploymentInstanceType": "ml.g5.2xlarge",
            "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": eagle}],
            "OutputConfig": {"S3OutputLocation": output},
            "StoppingCondition": {"MaxRuntimeInSeconds": 60}}


def refused(call: Any, message: str, **kw: Any) -> None:
    with pytest.raises(ClientError) as exc:
        call(**kw)
    assert error_of(exc) == ("ValidationException", message)


@pytest.fixture(scope="module")
def alices(pair: tuple[Stack, Caller, Caller]) -> dict[str, str]:
    """Alice's model, config and job, each claiming the buckets it names."""
    stack, alice, _ = pair
    alice.sm.create_model(**model("a-model", "s3://a-models/m/"))
    alice.sm.create_endpoint_config(**config("a-config", "a-model",
                                             **capture("s3://a-capture/traffic")))
    alice.sm.create_optimization_job(**job("a-job", "s3://a-models/m/", "s3://a-out/jobs/",
                                           data="s3://a-data/train/"))
    for bucket in ("a-models", "a-capture", "a-out", "a-data"):
        assert owner(stack, bucket) == ACCOUNT, bucket
    return {"model": "a-model"}


def test_creates_naming_another_accounts_bucket_are_refused(
        pair: tuple[Stack, Caller, Caller], alices: dict[str, str]) -> None:
    stack, alice, bob = pair
    sm = bob.sm
    for uri in ("s3://a-models/m/", "s3://a-models/other/"):
        refused(sm.create_model, MODEL_DATA.format(uri=uri), **model("b-model", uri))
    uri = "s3://a-models/m/model.tar.gz"
    refused(sm.create_model, MODEL_DATA.format(uri=uri), ModelName="b-model",
            ExecutionRoleArn=ROLE, PrimaryContainer={"Image": "eaglenest", "ModelDataUrl": uri})
    head = {"AdditionalModelDataSources": [{"ChannelName": "eagle_model", "S3DataSource": {
        "S3Uri": "s3://a-out/jobs/a-job/", "S3DataType": "S3Prefix",
        "CompressionType": "None"}}]}
    refused(sm.create_model, MODEL_DATA.format(uri="s3://a-out/jobs/a-job/"),
            **model("b-model", "s3://b-models/m/", **head))
    # a job: reading alice's model, training on her data, writing over her outputs
    refused(sm.create_optimization_job, MODEL_DATA.format(uri="s3://a-models/m/"),
            **job("b-job", "s3://a-models/m/", "s3://b-out/"))
    refused(sm.create_optimization_job,
            denied("OutputConfig.S3OutputLocation", "s3://a-out/jobs/a-job/", "a-out"),
            **job("b-job", "s3://b-models/m/", "s3://a-out/jobs/a-job/"))
    refused(sm.create_optimization_job,
            denied("OptimizationConfigs.1.ModelSpeculativeDecodingConfig.TrainingDataSource"
                   ".S3Uri", "s3://a-data/train/", "a-data"),
            **job("b-job", "s3://b-models/m/", "s3://b-out/", data="s3://a-data/train/"))
    # endpoint configs: Data Capture, async outputs, core dumps into alice's buckets
    sm.create_model(**model("b-model", "s3://b-models/m/"))
    refused(sm.create_endpoint_config,
            denied("DataCaptureConfig.DestinationS3Uri", "s3://a-capture/steal", "a-capture"),
            **config("b-config", "b-model", **capture("s3://a-capture/steal")))
    refused(sm.create_endpoint_config,
            denied("AsyncInferenceConfig.OutputConfig.S3OutputPath", "s3://a-out/async/",
                   "a-out"),
            **config("b-config", "b-model", AsyncInferenceConfig={
                "OutputConfig": {"S3OutputPath": "s3://a-out/async/"}}))
    dump = config("b-config", "b-model")
    dump["ProductionVariants"][0]["CoreDumpConfig"] = {"DestinationS3Uri": "s3://a-out/d/"}
    refused(sm.create_endpoint_config,
            denied("ProductionVariants.1.CoreDumpConfig.DestinationS3Uri", "s3://a-out/d/",
                   "a-out"), **dump)
    # nothing created, and the buckets of bob's refused requests were not claimed
    assert [m["ModelName"] for m in sm.list_models()["Models"]] == ["b-model"]
    assert sm.list_endpoint_configs()["EndpointConfigs"] == []
    assert sm.list_optimization_jobs()["OptimizationJobSummaries"] == []
    assert owner(stack, "b-out") is None
    for bucket in ("a-models", "a-capture", "a-out", "a-data"):
        assert owner(stack, bucket) == ACCOUNT
    assert owner(stack, "b-models") == bob.account  # by the one request that succeeded


def test_the_first_account_to_name_a_bucket_owns_it(pair: tuple[Stack, Caller, Caller],
                                                    alices: dict[str, str]) -> None:
    stack, alice, bob = pair
    bob.sm.create_endpoint_config(**config("b-first", "b-model",
                                           **capture("s3://b-capture/traffic")))
    assert owner(stack, "b-capture") == bob.account
    uri = "s3://b-capture/x/"
    refused(alice.sm.create_model, MODEL_DATA.format(uri=uri), **model("a-steal", uri))
    refused(alice.sm.create_endpoint_config,
            denied("DataCaptureConfig.DestinationS3Uri", "s3://b-capture/alice", "b-capture"),
            **config("a-steal", "a-model", **capture("s3://b-capture/alice")))
    # each account's own requests still work, again and again
    alice.sm.create_model(**model("a-model-2", "s3://a-models/m/"))
    bob.sm.create_endpoint_config(**config("b-second", "b-model",
                                           **capture("s3://b-capture/again")))



def s3_cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """`eaglenest s3 ...` on the stack's data dir; by default for the stack's account."""
    env = {**os.environ, "EAGLENEST_DATA_DIR": str(stack.data_dir),
           "EAGLENEST_ACCOUNT_ID": ACCOUNT}
    env.pop("EAGLENEST_S3_ENDPOINT_URL", None)
    return subprocess.run([sys.executable, "-m", "eaglenest.workers.cli", "s3", *args],
                          env=env, capture_output=True, text=True, cwd=ROOT, check=False)


def test_s3_cli_acts_for_one_account(pair: tuple[Stack, Caller, Caller], tmp_path: Path) -> None:
    stack, _, bob = pair
    mine, theirs = tmp_path / "alice.json", tmp_path / "bob.json"
    mine.write_text('{"by": "alice"}')
    theirs.write_text('{"by": "bob"}')
    stored = stack.data_dir / "s3" / "a-files" / "x.json"
    r = s3_cli(stack, "cp", str(mine), "s3://a-files/x.json")  # the default account: alice's
    assert r.returncode == 0, r.stderr
    assert owner(stack, "a-files") == ACCOUNT
    as_bob = f"(acting for account {bob.account} (key bob))"
    for args in (["cp", str(theirs), "s3://a-files/x.json", "--profile", "bob"],
                 ["cp", str(theirs), "s3://a-files/y.json", "--access-key", bob.key],
                 ["cp", "s3://a-files/", str(tmp_path / "stolen"), "--profile", "bob"],
                 ["ls", "s3://a-files/", "--access-key", bob.key]):
        r = s3_cli(stack, *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert "error: AccessDenied: s3://a-files/" in r.stderr and as_bob in r.stderr, args
        assert "s3://a-files/x.json" not in r.stdout
    assert stored.read_text() == '{"by": "alice"}' and not (tmp_path / "stolen").exists()
    assert not (stack.data_dir / "s3" / "a-files" / "y.json").exists()
    # bob's own bucket is his, and closed to alice's default key the same way
    r = s3_cli(stack, "cp", str(theirs), "s3://b-files/x.json", "--profile", "bob")
    assert r.returncode == 0, r.stderr
    assert owner(stack, "b-files") == bob.account
    r = s3_cli(stack, "ls", "s3://b-files/")
    assert r.returncode == 1 and "AccessDenied: s3://b-files/" in r.stderr
    assert f"acting for account {ACCOUNT} (the default" in r.stderr
    assert s3_cli(stack, "ls", "s3://a-files/").stdout == "s3://a-files/x.json\n"
    r = s3_cli(stack, "ls", "s3://a-files/", "--profile", "nobody")
    assert r.returncode != 0 and "--profile nobody: no such key" in r.stderr


def start_train_worker(stack: Stack) -> subprocess.Popen[bytes]:
    log = open(stack.data_dir / "worker-train.log", "ab")  # noqa: SIM115 (the child's)
    return subprocess.Popen([sys.executable, "-m", "eaglenest.workers.cli", "worker",
                             "--queues", "train"], env=stack.env(), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=log)


def test_a_job_whose_bucket_changed_owner_fails(pair: tuple[Stack, Caller, Caller],
                                                tmp_path: Path) -> None:
    stack, alice, bob = pair
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert s3_cli(stack, "cp", str(tmp_path / "m"), "s3://a-moved/m/").returncode == 0
    alice.sm.create_optimization_job(**job("a-moved", "s3://a-moved/m/", "s3://a-moved/out/"))
    # after CreateOptimizationJob, before any worker ran it, the bucket becomes bob's
    (stack.data_dir / "s3" / ".owners" / "a-moved").write_text(bob.account)
    worker = start_train_worker(stack)
    try:
        d = wait_status(alice.sm, "a-moved", {"FAILED", "COMPLETED"}, timeout=300)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert d["OptimizationJobStatus"] == "FAILED"
    assert d["FailureReason"].startswith("AccessDenied: s3://a-moved/m/"), d["FailureReason"]
    assert not (stack.data_dir / "s3" / "a-moved" / "out").exists()
