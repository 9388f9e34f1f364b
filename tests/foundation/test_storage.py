"""The artifact store over a local directory and over real S3 (moto_server, via boto3)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest

from eaglenest.foundation.processes import free_port
from eaglenest.foundation.storage import (
    LocalStore,
    S3Store,
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
    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(
        Bucket="bucket")
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
    migrate = subprocess.run([sys.executable, "-m", "eaglenest.workers.cli", "migrate"],
                             env=env, capture_output=True, text=True, cwd=root)
    assert migrate.returncode == 0, migrate.stderr  # s3 cp needs an initialised data dir
    r = subprocess.run([sys.executable, "-m", "eaglenest.workers.cli", "s3", "cp", str(src),
                        "s3://datasets/train/"], env=env, capture_output=True, text=True,
                       cwd=root)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "dd/s3/datasets/train/data.jsonl").read_text() == src.read_text()
    r = subprocess.run([sys.executable, "-m", "eaglenest.workers.cli", "s3", "cp", str(src),
                        "s3://datasets/../x"], env=env, capture_output=True, text=True, cwd=root)
    assert r.returncode != 0
