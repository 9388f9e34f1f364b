"""db/gpu_fit.py on a migrated SQLite database and a local bucket store: what Create reads
of a model folder (its listing, config.json, the index; a head's config.json and the sizes
of its safetensors), whose buckets it reads, and what it leaves to the worker.

Weights are sparse files: their sizes are real, their bytes never written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eaglenest.db import gpu_fit, models_repo
from eaglenest.db.session import Database
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.errors import ValidationException
from eaglenest.foundation.memory_plan import GIB
from eaglenest.foundation.store.storage import LocalStore, parse_uri

ACCOUNT = Account("us-east-1", "123456789012")
OTHER = Account("us-east-1", "222222222222")
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "vocab_size": 128256, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
LLAMA_8B_BYTES = 16060522496


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    s = LocalStore(tmp_path / "s3", default_account=ACCOUNT.account_id)
    s.claim("mine", ACCOUNT.account_id)
    s.claim("theirs", OTHER.account_id)
    return s


def put(store: LocalStore, uri: str, doc: Any = None, size: int | None = None) -> None:
    """A JSON object at `uri`, or a sparse file of `size` bytes."""
    target = parse_uri(uri)
    if size is None:
        store.put_bytes(target, json.dumps(doc).encode())
        return
    path = store.root / target.bucket / target.key
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        fh.truncate(size)


def model(db: Database, name: str, container: dict[str, Any],
          account: Account = ACCOUNT) -> None:
    with db.session() as s:
        models_repo.create(s, account, {
            "ModelName": name, "ExecutionRoleArn": "arn:aws:iam::123456789012:role/r",
            "PrimaryContainer": {"Image": "lmi", **container}})


def prefix(uri: str, head: str | None = None, **env: str) -> dict[str, Any]:
    def source(u: str) -> dict[str, Any]:
        return {"S3Uri": u, "S3DataType": "S3Prefix", "CompressionType": "None"}
    out: dict[str, Any] = {"ModelDataSource": {"S3DataSource": source(uri)},
                           "Environment": env}
    if head:
        out["AdditionalModelDataSources"] = [{"ChannelName": "eagle_model",
                                              "S3DataSource": source(head)}]
    return out


def check(db: Database, store: LocalStore | None, name: str, itype: str,
          account: Account = ACCOUNT) -> None:
    with db.session() as s:
        gpu_fit.check_endpoint_config(s, account, {"ProductionVariants": [{
            "VariantName": "v", "ModelName": name, "InstanceType": itype}]}, store)


def llama(store: LocalStore, where: str, weights: str = "index") -> None:
    put(store, f"{where}config.json", LLAMA_8B)
    if weights == "index":
        put(store, f"{where}model.safetensors.index.json",
            {"metadata": {"total_size": LLAMA_8B_BYTES}})
    elif weights == "file":
        put(store, f"{where}model.safetensors", size=LLAMA_8B_BYTES)


def test_the_head_is_read_from_its_channel(db, store):
    """Llama-3.1-8B (15.0 GiB) fits one A10G (19.4 GiB usable) with a 0.5 GiB head, not
    with a 4 GiB one: the head's safetensors bytes count, not an estimate."""
    llama(store, "s3://mine/llama/", weights="file")
    head = {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
            "torch_dtype": "bfloat16"}
    for name, size in (("small", GIB // 2), ("big", 4 * GIB)):
        put(store, f"s3://mine/{name}-head/config.json", head)
        put(store, f"s3://mine/{name}-head/model.safetensors", size=size)
        model(db, name, prefix("s3://mine/llama/", f"s3://mine/{name}-head/"))
    check(db, store, "small", "ml.g5.2xlarge")
    with pytest.raises(ValidationException) as exc:
        check(db, store, "big", "ml.g5.2xlarge")
    assert "15.0 GiB of weights + 4.0 GiB for the draft head" in str(exc.value)


def test_a_head_create_cannot_read_is_estimated(db, store):
    llama(store, "s3://mine/llama/")
    model(db, "m", prefix("s3://mine/llama/", "s3://mine/absent-head/"))
    with pytest.raises(ValidationException) as exc:
        check(db, store, "m", "ml.g4dn.xlarge")  # T4: 16 GiB, bfloat16 becomes float16
    assert exc.value.args[0].startswith("Variant 'v': the model does not fit ml.g4dn.xlarge")
    assert "in float16, 15.0 GiB of weights + " in str(exc.value)
    assert "+ 0.0 GiB for the draft head" not in str(exc.value)


def test_without_an_index_the_safetensors_are_sized(db, store):
    llama(store, "s3://mine/one-file/", weights="file")
    model(db, "one", prefix("s3://mine/one-file"))  # no trailing slash: the same folder
    with pytest.raises(ValidationException) as exc:
        check(db, store, "one", "ml.g4dn.xlarge")
    assert "15.0 GiB of weights" in str(exc.value)


@pytest.mark.parametrize("config", [b"{not json", b"{}", json.dumps(LLAMA_8B).encode()],
                         ids=["not-json", "placeholder", "no-weights"])
def test_a_folder_the_plan_cannot_size_is_left_to_the_worker(db, store, config):
    """memory_plan's ShapeError (config.json unreadable or without the model's shape, no
    safetensors) is not a proof that the model cannot fit: the worker names it."""
    store.put_bytes(parse_uri("s3://mine/odd/config.json"), config)
    model(db, "m", prefix("s3://mine/odd/"))
    check(db, store, "m", "ml.g4dn.xlarge")


@pytest.mark.parametrize(("container", "account"), [
    (prefix("s3://theirs/llama/"), ACCOUNT),  # another account's bucket is never read
    (prefix("s3://unowned/llama/"), OTHER),  # no owner: only the default account reads it
    ({"ModelDataUrl": "s3://mine/llama.tar.gz"}, ACCOUNT),
    ({"ModelDataUrl": "s3://mine/single"}, ACCOUNT),  # one object: the worker's to unpack
    ({"ModelDataSource": {"S3DataSource": {"S3Uri": "s3://mine/llama/",
                                           "S3DataType": "S3Prefix",
                                           "CompressionType": "Gzip"}}}, ACCOUNT),
], ids=["other-account", "unowned-not-default", "tarball", "single-object", "gzip"])
def test_what_create_may_not_or_cannot_read_plans_nothing(db, store, container, account):
    for where in ("s3://theirs/llama/", "s3://unowned/llama/", "s3://mine/llama/"):
        llama(store, where)
    store.put_bytes(parse_uri("s3://mine/single"), b"x")
    model(db, "m", container, account)
    check(db, store, "m", "ml.g4dn.xlarge", account)  # would not fit, were it planned


def test_the_default_account_reads_a_bucket_nobody_owns(db, store):
    llama(store, "s3://unowned/llama/")
    model(db, "m", prefix("s3://unowned/llama/"))
    with pytest.raises(ValidationException):
        check(db, store, "m", "ml.g4dn.xlarge")


def test_options_are_read_on_any_type_and_without_a_store(db, store):
    """A model stored before CreateModel read its options (it refuses int8 now)."""
    model(db, "m", prefix("s3://mine/absent/"))
    with db.session() as s:
        row = models_repo.get(s, ACCOUNT, "m")
        container = row.spec["PrimaryContainer"]
        row.spec = {**row.spec, "PrimaryContainer": {
            **container, "Environment": {**container["Environment"], "OPTION_DTYPE": "int8"}}}
    for itype in ("ml.m5.xlarge", "ml.g5.2xlarge"):
        with pytest.raises(ValidationException) as exc:
            check(db, None, "m", itype)
        assert str(exc.value).startswith("Variant 'v': OPTION_DTYPE='int8' is not a dtype")


def job(store: LocalStore | None, db: Database, source: dict[str, Any], itype: str,
        **env: str) -> None:
    with db.session() as s:
        gpu_fit.check_job(s, ACCOUNT, {"ModelSource": source, "DeploymentInstanceType": itype,
                                       "OptimizationEnvironment": env}, store)


def test_a_job_plans_an_estimated_head_on_all_the_gpus(db, store):
    llama(store, "s3://mine/llama/")
    model(db, "m", prefix("s3://mine/llama/"))
    job(store, db, {"S3": {"S3Uri": "s3://mine/llama/"}}, "ml.g5.2xlarge")
    with pytest.raises(ValidationException) as exc:  # 16 layers over the full vocabulary
        job(store, db, {"SageMakerModel": {"ModelName": "m"}}, "ml.g5.2xlarge",
            EAGLENEST_NUM_LAYERS="16", EAGLENEST_DRAFT_VOCAB_SIZE="128256")
    assert str(exc.value).startswith("DeploymentInstanceType ml.g5.2xlarge: the model does "
                                     "not fit ml.g5.2xlarge")
    job(store, db, {"SageMakerModel": {"ModelName": "m"}}, "ml.g5.12xlarge",
        EAGLENEST_NUM_LAYERS="16", OPTION_TENSOR_PARALLEL_DEGREE="max")
    with pytest.raises(ValidationException) as exc:
        job(None, db, {"S3": {"S3Uri": "s3://mine/llama/"}}, "ml.m5.xlarge",
            EAGLENEST_DTYPE="fp8")
    assert str(exc.value).startswith("OptimizationEnvironment: EAGLENEST_DTYPE='fp8'")


def test_a_dflash_job_plans_its_own_layer_count(db, store):
    llama(store, "s3://mine/llama/")
    model(db, "m", prefix("s3://mine/llama/"))
    env = {"EAGLENEST_DRAFT_VOCAB_SIZE": "128256"}
    job(store, db, {"SageMakerModel": {"ModelName": "m"}}, "ml.g5.2xlarge", **env)
    with pytest.raises(ValidationException) as exc:  # 8 DFlash layers, each with its KV cache
        job(store, db, {"SageMakerModel": {"ModelName": "m"}}, "ml.g5.2xlarge",
            EAGLENEST_DFLASH_LAYERS="8", **env)
    assert "the model does not fit ml.g5.2xlarge" in str(exc.value)


def test_the_default_draft_vocabulary_is_the_workers():
    options = pytest.importorskip("eaglenest.workers.jobs.options")
    from eaglenest.foundation.memory_plan import DEFAULT_DRAFT_VOCAB

    assert options.JobOptions().draft_vocab_size == DEFAULT_DRAFT_VOCAB
