"""Buckets belong to accounts, on a real `eaglenest up` with two accounts (alice: the stack's
key and the operator's default account, bob: a key of a new account). A bucket is owned by
the first account to write into it (`eaglenest s3 cp`, a job's output, a capture; a job's
output location and a capture destination are claimed at Create) or by the one an operator
assigns it to (`eaglenest s3 owner`); naming a bucket to read claims nothing, and a bucket no
account owns is readable only by the default account. A Create request of bob's naming one
of alice's buckets anywhere (model data, job input, output, training data, Data Capture, core
dumps, async outputs) is refused with SageMaker's error and creates nothing, claims nothing.
`eaglenest s3` acts for one account and is refused the other's buckets; a job whose bucket
changed owner after Create fails with AccessDenied."""

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

from tests.security.conftest import ROLE, container, error_of
from tests.security.test_isolation import Caller, keys_cli
from tests.support.jobs import ROOT, wait_status
from tests.support.stack import ACCOUNT, Stack

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


def put(stack: Stack, folder: Path, uri: str, *options: str) -> None:
    """Write a file into `uri` with `eaglenest s3 cp` (as the default account, or
    `--profile NAME`): the upload makes an unowned bucket the uploader's."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    r = s3_cli(stack, "cp", str(folder), uri, *options)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def alices(pair: tuple[Stack, Caller, Caller],
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Alice's model, config and job: her model and data buckets are hers by her uploads,
    her job's output and her capture destination by the Creates naming them as outputs."""
    stack, alice, bob = pair
    folder = tmp_path_factory.mktemp("alices")
    put(stack, folder, "s3://a-models/m/")
    put(stack, folder, "s3://a-data/train/")
    put(stack, folder, "s3://b-models/m/", "--profile", "bob")  # bob's, for bob's requests
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
    assert owner(stack, "b-models") == bob.account  # by bob's upload in `alices`


def test_an_output_location_is_claimed_at_create(pair: tuple[Stack, Caller, Caller],
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
    return subprocess.run([sys.executable, "-m", "eaglenest.cli", "s3", *args],
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
    return subprocess.Popen([sys.executable, "-m", "eaglenest.cli", "worker",
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


def no_owner(member: str, uri: str, bucket: str, account: str) -> str:
    return (f"{member}: Access Denied to {uri}: the bucket '{bucket}' has no owner, and only "
            "the operator's default account may read a bucket no account owns; an operator "
            f"assigns it with `eaglenest s3 owner s3://{bucket} --account {account}`.")


def placed(stack: Stack, bucket: str) -> str:
    """A folder the operator put in the store with its own access (no owner); its URI."""
    (stack.data_dir / "s3" / bucket / "m").mkdir(parents=True)
    (stack.data_dir / "s3" / bucket / "m" / "config.json").write_text("{}")
    return f"s3://{bucket}/m/"


PRIMARY = "PrimaryContainer.ModelDataSource.S3DataSource.S3Uri"


def test_naming_buckets_to_read_claims_none(pair: tuple[Stack, Caller, Caller],
                                            alices: dict[str, str], tmp_path: Path) -> None:
    stack, alice, bob = pair
    names = [f"named-{i}" for i in range(15)]
    fifteen = [{"Image": "eaglenest", "ModelDataUrl": f"s3://{b}/model.tar.gz"} for b in names]
    alice.sm.create_model(ModelName="a-fifteen", ExecutionRoleArn=ROLE, Containers=fifteen)
    assert [owner(stack, b) for b in names] == [None] * 15  # the default account read them
    r = s3_cli(stack, "owner", "s3://named-0")
    assert r.returncode == 0 and r.stdout.startswith(
        f"s3://named-0: owner none (readable only by the default account {ACCOUNT}"), r.stdout
    refused(bob.sm.create_model, no_owner("Containers.1.ModelDataUrl",
                                          "s3://named-0/model.tar.gz", "named-0", bob.account),
            ModelName="b-fifteen", ExecutionRoleArn=ROLE, Containers=fifteen)
    assert [owner(stack, b) for b in names] == [None] * 15
    # the first account to write into one owns it: here bob, by an upload
    put(stack, tmp_path / "m", "s3://named-3/m/", "--profile", "bob")
    assert owner(stack, "named-3") == bob.account
    r = s3_cli(stack, "owner", "s3://named-3/m/")
    assert r.stdout == f"s3://named-3: owner account {bob.account}\n", r.stdout
    bob.sm.create_model(**model("b-named", "s3://named-3/m/"))
    refused(alice.sm.create_model, MODEL_DATA.format(uri="s3://named-3/m/"),
            **model("a-named", "s3://named-3/m/"))


def test_an_unowned_bucket_is_read_only_by_the_default_account(
        pair: tuple[Stack, Caller, Caller], alices: dict[str, str], tmp_path: Path) -> None:
    stack, alice, bob = pair
    uri = placed(stack, "op-data")
    refused(bob.sm.create_model, no_owner(PRIMARY, uri, "op-data", bob.account),
            **model("b-op", uri))
    data = "OptimizationConfigs.1.ModelSpeculativeDecodingConfig.TrainingDataSource.S3Uri"
    refused(bob.sm.create_optimization_job, no_owner(data, uri, "op-data", bob.account),
            **job("b-op", "s3://b-models/m/", "s3://b-op-out/", data=uri))
    assert "b-op" not in [m["ModelName"] for m in bob.sm.list_models()["Models"]]
    assert owner(stack, "op-data") is None and owner(stack, "b-op-out") is None
    r = s3_cli(stack, "cp", uri, str(tmp_path / "bob"), "--profile", "bob")
    assert r.returncode == 1 and "AccessDenied: s3://op-data/m/" in r.stderr, r.stderr
    assert "'op-data' has no owner" in r.stderr and not (tmp_path / "bob").exists()
    alice.sm.create_model(**model("a-op", uri))  # the default account reads it...
    assert s3_cli(stack, "cp", uri, str(tmp_path / "alice")).returncode == 0
    assert owner(stack, "op-data") is None  # ...and claims nothing
    # a bucket the same request writes into (Data Capture) may be named there to read too
    async_out = {"OutputConfig": {"S3OutputPath": "s3://b-self/async/"}}
    refused(bob.sm.create_endpoint_config,
            no_owner("AsyncInferenceConfig.OutputConfig.S3OutputPath", "s3://b-self/async/",
                     "b-self", bob.account),
            **config("b-self", "b-model", AsyncInferenceConfig=async_out))
    bob.sm.create_endpoint_config(**config("b-self", "b-model", AsyncInferenceConfig=async_out,
                                           **capture("s3://b-self/capture")))
    assert owner(stack, "b-self") == bob.account


def test_an_operator_assigns_and_releases_an_owner(pair: tuple[Stack, Caller, Caller],
                                                   alices: dict[str, str]) -> None:
    stack, alice, bob = pair
    uri = placed(stack, "op-given")
    r = s3_cli(stack, "owner", "s3://op-given", "--account", bob.account)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"s3://op-given: owner account {bob.account} (was none)\n"
    assert owner(stack, "op-given") == bob.account
    bob.sm.create_model(**model("b-given", uri))
    refused(alice.sm.create_model, MODEL_DATA.format(uri=uri), **model("a-given", uri))
    # released while bob's model names it: bob's reads are refused, the default account's not
    r = s3_cli(stack, "owner", "s3://op-given/m/", "--release")
    assert r.returncode == 0 and r.stdout.startswith(
        f"s3://op-given: owner none (readable only by the default account {ACCOUNT}")
    assert r.stdout.endswith(f"(was account {bob.account})\n") and owner(stack, "op-given") is None
    assert bob.sm.describe_model(ModelName="b-given")["ModelName"] == "b-given"
    refused(bob.sm.create_model, no_owner(PRIMARY, uri, "op-given", bob.account),
            **model("b-given-2", uri))
    r = s3_cli(stack, "ls", uri, "--profile", "bob")
    assert r.returncode == 1 and "'op-given' has no owner" in r.stderr, r.stderr
    assert s3_cli(stack, "ls", uri).stdout == "s3://op-given/m/config.json\n"
    alice.sm.create_model(**model("a-given", uri))
    for args, message in ((["s3://op-given", "--account", "12345"], "12 digits"),
                          (["op-given", "--account", bob.account], "not an S3 URI"),
                          (["s3://op-given/.eaglenest/owner", "--release"], "reserved")):
        r = s3_cli(stack, "owner", *args)
        assert r.returncode == 1 and r.stderr.startswith("error: ") and message in r.stderr, \
            (args, r.stderr)
    assert owner(stack, "op-given") is None


def test_a_jobs_output_written_claims_its_bucket(pair: tuple[Stack, Caller, Caller],
                                                 tmp_path: Path) -> None:
    """A job's outputs are written as workers/jobs/optimize.py does: through its account's
    view of the worker's store, published with `publish_dir` (workers/jobs/pipeline.py)."""
    from eaglenest.foundation.settings import Settings
    from eaglenest.foundation.store.buckets import AccessDenied, AccountStore
    from eaglenest.foundation.store.storage import make_store, parse_uri, publish_dir

    stack, _, bob = pair
    settings = Settings(data_dir=stack.data_dir, account_id=ACCOUNT, s3_endpoint_url=None)
    (tmp_path / "out" / "eagle_model").mkdir(parents=True)
    (tmp_path / "out" / "eagle_model" / "config.json").write_text("{}")
    assert owner(stack, "b-job-out") is None
    publish_dir(AccountStore(make_store(settings), bob.account), tmp_path / "out",
                "s3://b-job-out/jobs/b-job/")
    assert owner(stack, "b-job-out") == bob.account
    with pytest.raises(AccessDenied):  # not even the default account reads it now
        AccountStore(make_store(settings), ACCOUNT).list_keys(parse_uri("s3://b-job-out/"))
