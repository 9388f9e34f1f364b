"""The artifact store over a local directory and over real S3 (moto_server, via boto3)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest

from eaglenest.foundation.host.processes import free_port
from eaglenest.foundation.store.buckets import AccessDenied, AccountStore
from eaglenest.foundation.store.s3_store import S3Store
from eaglenest.foundation.store.storage import (
    LocalStore,
    StorageError,
    download_prefix,
    parse_uri,
    publish_dir,
    read_manifest,
)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    port = free_port()
    exe = shutil.which("moto_server")
    cmd = [exe] if exe else [sys.executable, "-m", "moto.server"]
    proc = subprocess.Popen([*cmd, "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            assert time.monotonic() < deadline, "moto_server did not start"
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path, moto_url, monkeypatch):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    for k, v in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    client.create_bucket(Bucket="bucket")
    for obj in client.list_objects_v2(Bucket="bucket").get("Contents", []):  # moto is shared
        client.delete_object(Bucket="bucket", Key=obj["Key"])
    return S3Store(moto_url, "us-east-1")


@pytest.mark.parametrize("uri", [
    "s3://bucket/../etc/passwd", "s3://bucket/a/../../x", "s3://bucket//abs", "s3://bucket/a\\b",
    "http://bucket/key", "s3://UPPER/key", "not-a-uri",
])
def test_bad_uris_rejected(uri):
    with pytest.raises(StorageError):
        parse_uri(uri)


def test_round_trip_prefix_and_manifest(store, tmp_path):
    src = tmp_path / "model"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text('{"a": 1}')
    (src / "sub" / "w.bin").write_bytes(os.urandom(1000))
    uris = publish_dir(store, src, "s3://bucket/out/job1")
    assert uris == ["s3://bucket/out/job1/config.json", "s3://bucket/out/job1/sub/w.bin"]
    manifest = json.loads(store.get_bytes(parse_uri("s3://bucket/out/job1/_MANIFEST.json")))
    assert manifest == {"files": ["config.json", "sub/w.bin"]}
    got = download_prefix(store, "s3://bucket/out/job1/", tmp_path / "back")
    assert sorted(p.relative_to(tmp_path / "back").as_posix() for p in got) == \
        ["_MANIFEST.json", "config.json", "sub/w.bin"]
    assert (tmp_path / "back/sub/w.bin").read_bytes() == (src / "sub/w.bin").read_bytes()
    one = download_prefix(store, "s3://bucket/out/job1/config.json", tmp_path / "one")
    assert [p.name for p in one] == ["config.json"]
    store.put_bytes(parse_uri("s3://bucket/m.json"),
                    json.dumps([{"prefix": "s3://bucket/out/job1/"}, "config.json"]).encode())
    assert read_manifest(store, "s3://bucket/m.json") == ["s3://bucket/out/job1/config.json"]


def test_missing_things_are_clear(store, tmp_path):
    with pytest.raises(StorageError, match="nothing found at s3://bucket/none/"):
        download_prefix(store, "s3://bucket/none/", tmp_path)
    with pytest.raises(StorageError, match="does not exist"):
        store.get_bytes(parse_uri("s3://bucket/none.json"))


def test_cli_cp_into_local_store(tmp_path):
    src = tmp_path / "data.jsonl"
    src.write_text('{"prompt": "a", "completion": "b"}\n')
    env = {**os.environ, "EAGLENEST_DATA_DIR": str(tmp_path / "dd")}
    env.pop("EAGLENEST_S3_ENDPOINT_URL", None)
    root = Path(__file__).resolve().parents[2]
    migrate = subprocess.run([sys.executable, "-m", "eaglenest.cli", "migrate"],
                             env=env, capture_output=True, text=True, cwd=root)
    assert migrate.returncode == 0, migrate.stderr  # s3 cp needs an initialised data dir
    r = subprocess.run([sys.executable, "-m", "eaglenest.cli", "s3", "cp", str(src),
                        "s3://datasets/train/"], env=env, capture_output=True, text=True,
                       cwd=root)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "dd/s3/datasets/train/data.jsonl").read_text() == src.read_text()
    r = subprocess.run([sys.executable, "-m", "eaglenest.cli", "s3", "cp", str(src),
                        "s3://datasets/../x"], env=env, capture_output=True, text=True, cwd=root)
    assert r.returncode != 0


# -- buckets belong to accounts ------------------------------------------------------------

A, B = "111111111111", "222222222222"


def new_bucket(store, name: str) -> str:
    """A bucket no account owns yet (S3: created first, as an operator would)."""
    if isinstance(store, S3Store):
        store.client.create_bucket(Bucket=name)
    return name


def test_claim_race_has_exactly_one_winner(store):
    for i in range(8):
        bucket = new_bucket(store, f"race-{i}")
        barrier, results = threading.Barrier(2), {}

        def claim(account: str, bucket: str = bucket, barrier=barrier, results=results) -> None:
            barrier.wait()
            results[account] = store.claim(bucket, account)

        threads = [threading.Thread(target=claim, args=(a,)) for a in (A, B)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results[A] == results[B] in (A, B)  # both told the same single winner
        assert store.owner(bucket) == results[A]


def test_first_writer_owns_the_bucket_and_others_are_denied(store, tmp_path):
    alice, bob = AccountStore(store, A), AccountStore(store, B)
    assert store.owner("bucket") is None
    alice.put_bytes(parse_uri("s3://bucket/head/w.bin"), b"alice")  # claims it
    assert store.owner("bucket") == A
    src = tmp_path / "f.bin"
    src.write_bytes(b"bob")
    attempts = [
        lambda: bob.put_bytes(parse_uri("s3://bucket/head/w.bin"), b"bob"),
        lambda: bob.put_file(parse_uri("s3://bucket/head/w.bin"), src),
        lambda: bob.get_bytes(parse_uri("s3://bucket/head/w.bin")),
        lambda: bob.get_file(parse_uri("s3://bucket/head/w.bin"), tmp_path / "out"),
        lambda: bob.list_keys(parse_uri("s3://bucket/")),
        lambda: bob.delete(parse_uri("s3://bucket/head/w.bin")),
        lambda: download_prefix(bob, "s3://bucket/head/", tmp_path / "dl"),
        lambda: publish_dir(AccountStore(store, B), tmp_path, "s3://bucket/head/"),
    ]
    for attempt in attempts:
        with pytest.raises(AccessDenied, match="AccessDenied: s3://bucket/") as info:
            attempt()
        assert isinstance(info.value, StorageError) and info.value.account_id == B
    assert alice.get_bytes(parse_uri("s3://bucket/head/w.bin")) == b"alice"  # unchanged
    assert alice.list_keys(parse_uri("s3://bucket/")) == ["head/w.bin"]  # record hidden
    assert store.owner("bucket") == A


def test_reading_an_unowned_bucket_claims_nothing(store, tmp_path):
    store.default_account = B  # the operator's default account (make_store: Settings')
    store.put_bytes(parse_uri("s3://bucket/data.jsonl"), b"{}\n")  # the operator's upload
    assert AccountStore(store, B).get_bytes(parse_uri("s3://bucket/data.jsonl")) == b"{}\n"
    assert store.owner("bucket") is None
    with pytest.raises(AccessDenied, match="'bucket' has no owner") as info:  # not default
        AccountStore(store, A).get_bytes(parse_uri("s3://bucket/data.jsonl"))
    assert info.value.unowned and store.owner("bucket") is None
    AccountStore(store, A).put_bytes(parse_uri("s3://bucket/out.json"), b"{}")
    with pytest.raises(AccessDenied):
        AccountStore(store, B).get_bytes(parse_uri("s3://bucket/data.jsonl"))


def test_a_view_notices_an_owner_change_made_before_it_was_made(tmp_path):
    store = LocalStore(tmp_path / "store")
    AccountStore(store, A).put_bytes(parse_uri("s3://bucket/x"), b"x")
    (tmp_path / "store" / ".owners" / "bucket").write_text(B)  # the operator hands it over
    with pytest.raises(AccessDenied):
        AccountStore(store, A).get_bytes(parse_uri("s3://bucket/x"))
    assert AccountStore(store, B).get_bytes(parse_uri("s3://bucket/x")) == b"x"


@pytest.mark.parametrize("uri", ["s3://bucket/.eaglenest/owner", "s3://bucket/.eaglenest"])
def test_the_owner_record_cannot_be_named(uri):
    with pytest.raises(StorageError, match="reserved"):
        parse_uri(uri)
