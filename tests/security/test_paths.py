"""Paths built from stored data stay in their folder (issue #35, finding 3).

A checkpoint pointer or a key is data someone wrote into the store (with `eaglenest s3 cp`,
or with the store's own credentials): a restore or a download that joined it onto a local
folder could write anywhere (`/tmp/x`, `../../x`, `a//tmp/x` restarts the path on S3, which
keeps `//` in keys). Each case runs against the local store and against S3 (moto, in
process) and checks that it is refused, naming what was refused, and that no file appears or
changes anywhere but in the store."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eaglenest.foundation.store.s3_store import S3Store
from eaglenest.foundation.store.storage import (
    LocalStore,
    S3Uri,
    StorageError,
    download_prefix,
    parse_uri,
)
from eaglenest.workers.infra.checkpoint_sync import CheckpointSync
from tests.security.asgi_api import InProcessApi

PREFIX = "s3://out/jobs/j/_checkpoints/"
KEY_PREFIX = "jobs/j/_checkpoints/"
ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"


class Planted:
    """A store plus a way to put any key in it, as someone bypassing EagleNest would."""

    def __init__(self, kind: str, store: Any, root: Path | None = None) -> None:
        self.kind, self.store, self.root = kind, store, root

    def put(self, bucket: str, key: str, data: bytes) -> None:
        if self.kind == "s3":
            self.store.client.put_object(Bucket=bucket, Key=key, Body=data)
            return
        assert self.root is not None and "//" not in key  # a folder cannot hold `a//b`
        path = self.root / bucket / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


@pytest.fixture(params=["local", "s3"])
def planted(request: pytest.FixtureRequest, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Planted]:
    if request.param == "local":
        yield Planted("local", LocalStore(tmp_path / "store"), tmp_path / "store")
        return
    from moto import mock_aws

    for k, v in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        store = S3Store(None, "us-east-1")
        for bucket in ("out", "models"):
            store.client.create_bucket(Bucket=bucket)
        yield Planted("s3", store)


def files_under(root: Path) -> dict[str, bytes]:
    """Every file under `root` (links not followed) and its bytes."""
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            out[str(path)] = b"" if path.is_symlink() else path.read_bytes()
    return out


# ---- URIs ------------------------------------------------------------------------------

@pytest.mark.parametrize("uri", ["s3://bkt//k", "s3://bkt/a//b", "s3://bkt/a/b//", "s3://bkt/a/./b"])
def test_uri_with_an_empty_or_dot_segment_is_refused_naming_it(uri: str) -> None:
    with pytest.raises(StorageError) as exc:
        parse_uri(uri)
    assert uri in str(exc.value)
    assert parse_uri("s3://bkt/a/b/").key == "a/b/" and parse_uri("s3://bkt").key == ""


def test_local_store_refuses_a_key_a_path_would_collapse(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put_bytes(parse_uri("s3://bkt/a/k"), b"x")
    with pytest.raises(StorageError, match="s3://bkt/a//k"):
        store.get_bytes(S3Uri("bkt", "a//k"))  # S3 would read another object than a/k


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> InProcessApi:
    for name in ("EAGLENEST_ACCESS_KEY_ID", "EAGLENEST_SECRET_ACCESS_KEY",
                 "EAGLENEST_S3_ENDPOINT_URL", "EAGLENEST_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    data = tmp_path / "data"
    data.mkdir()
    (data / "credentials").write_text(
        "[eaglenest]\naws_access_key_id = AKIAPATHSTEST0000001\n"
        "aws_secret_access_key = secret1\neaglenest_account_id = 123456789012\n")
    return InProcessApi(data)


def _job(output: str, model: str = "s3://models/m/") -> dict[str, Any]:
    return {"OptimizationJobName": "j1", "RoleArn": ROLE,
            "ModelSource": {"S3": {"S3Uri": model}},
            "DeploymentInstanceType": "ml.g5.2xlarge",
            "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
            "OutputConfig": {"S3OutputLocation": output},
            "StoppingCondition": {"MaxRuntimeInSeconds": 60}}


@pytest.mark.parametrize(("op", "body", "member", "uri"), [
    ("CreateModel", {"ModelName": "m1", "ExecutionRoleArn": ROLE, "PrimaryContainer": {
        "Image": "eaglenest", "ModelDataUrl": "s3://mbucket/a//b/"}},
     "PrimaryContainer.ModelDataUrl", "s3://mbucket/a//b/"),
    ("CreateOptimizationJob", _job("s3://obucket//x/"), "OutputConfig.S3OutputLocation",
     "s3://obucket//x/"),
    ("CreateOptimizationJob", _job("s3://obucket/x/", "s3://mbucket/m//"),
     "ModelSource.S3.S3Uri", "s3://mbucket/m//"),
])
def test_create_with_an_empty_segment_is_refused_and_changes_nothing(
        api: InProcessApi, op: str, body: dict[str, Any], member: str, uri: str) -> None:
    r = api.call(op, body, "AKIAPATHSTEST0000001", "secret1")
    assert r.status_code == 400, r.text
    assert r.json()["__type"] == "ValidationException"
    assert r.json()["message"].startswith(f"{member}: '{uri}'"), r.json()
    assert api.call("ListModels", {}, "AKIAPATHSTEST0000001", "secret1").json()["Models"] == []
    jobs = api.call("ListOptimizationJobs", {}, "AKIAPATHSTEST0000001", "secret1").json()
    assert jobs["OptimizationJobSummaries"] == []
    store = LocalStore(api.settings.artifact_dir)
    assert store.owner("mbucket") is None and store.owner("obucket") is None  # not claimed


# ---- checkpoint restore ------------------------------------------------------------------

def test_absolute_pointer_is_refused_and_nothing_written(planted: Planted,
                                                         tmp_path: Path) -> None:
    outside = tmp_path / "outside" / "evil"  # absolute: /tmp/.../outside/evil
    planted.put("out", KEY_PREFIX + "latest", str(outside).encode())
    if planted.kind == "s3":  # what a restore of that pointer would fetch: ..._checkpoints//tmp/...
        planted.put("out", f"{KEY_PREFIX}{outside}/pwned", b"owned")
    before = files_under(tmp_path)
    sync = CheckpointSync(planted.store, PREFIX)
    with pytest.raises(StorageError, match=f"{PREFIX}latest holds .*not a checkpoint name"):
        sync.restore(tmp_path / "work")
    assert files_under(tmp_path) == before
    assert not (tmp_path / "outside").exists()

    # the next checkpoint replaces the bad pointer (and leaves what it named alone)
    ckpt = tmp_path / "ckpt" / "step-00000002"
    ckpt.mkdir(parents=True)
    (ckpt / "head.bin").write_bytes(b"head")
    sync.upload(ckpt)
    assert sync.remote_latest() == "step-00000002"
    assert sync.restore(tmp_path / "work2")
    assert (tmp_path / "work2/checkpoints/step-00000002/head.bin").read_bytes() == b"head"


@pytest.mark.parametrize("pointer", ["../../x", "step-00000001/../../../x", "latest", "step-1",
                                     " /etc"])
def test_pointer_that_is_not_a_checkpoint_name_is_refused(planted: Planted, tmp_path: Path,
                                                          pointer: str) -> None:
    planted.put("out", KEY_PREFIX + "latest", pointer.encode())
    if planted.kind == "s3":  # S3 keeps `..` in keys as written
        planted.put("out", f"{KEY_PREFIX}{pointer.strip()}/pwned", b"owned")
    before = files_under(tmp_path)
    with pytest.raises(StorageError, match=f"{PREFIX}latest holds"):
        CheckpointSync(planted.store, PREFIX).restore(tmp_path / "work" / "a")
    assert files_under(tmp_path) == before


def test_key_with_an_empty_segment_is_refused_before_anything_is_written(
        planted: Planted, tmp_path: Path) -> None:
    if planted.kind == "local":
        pytest.skip("a folder cannot hold the key a//b: only S3 can")
    outside = tmp_path / "outside" / "pwned"
    planted.put("out", KEY_PREFIX + "latest", b"step-00000001")
    planted.put("out", KEY_PREFIX + "step-00000001/head.bin", b"head")
    evil = f"{KEY_PREFIX}step-00000001/{outside}"  # ...step-00000001//tmp/.../outside/pwned
    planted.put("out", evil, b"owned")
    before = files_under(tmp_path)
    with pytest.raises(StorageError, match="s3://out/" + evil):
        CheckpointSync(planted.store, PREFIX).restore(tmp_path / "work")
    assert files_under(tmp_path) == before  # not even head.bin: keys are checked first
    assert not outside.exists()


# ---- downloads of a prefix (job inputs, deployments, `eaglenest s3 cp`) ---------------------

def test_download_refuses_a_key_with_an_empty_segment(planted: Planted, tmp_path: Path) -> None:
    if planted.kind == "local":
        pytest.skip("a folder cannot hold the key a//b: only S3 can")
    planted.put("models", "m/config.json", b"{}")
    planted.put("models", "m/a//b", b"x")
    with pytest.raises(StorageError, match="s3://models/m/a//b"):
        download_prefix(planted.store, "s3://models/m/", tmp_path / "dest")
    assert files_under(tmp_path) == {}


def test_download_does_not_follow_a_link_out_of_the_destination(planted: Planted,
                                                                tmp_path: Path) -> None:
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "sub").symlink_to(outside)
    planted.put("models", "m/sub/f", b"x")
    before = files_under(tmp_path)
    with pytest.raises(StorageError, match="s3://models/m/sub/f.*leaves"):
        download_prefix(planted.store, "s3://models/m/", dest)
    assert files_under(tmp_path) == before and not (outside / "f").exists()
