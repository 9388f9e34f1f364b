"""Private files and a locked-down broker: the data dir is 0700 and its secrets 0600, `up`
warns about a credentials file others can read, the embedded Redis needs its password and
has no CONFIG/DEBUG/MODULE; uploads refuse symbolic links, keys refuse control characters."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from botocore.exceptions import ClientError

from eaglenest.workers.infra.broker import embedded_url
from tests.security.conftest import ROLE, error_of
from tests.support.jobs import ROOT
from tests.support.stack import Stack


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_data_dir_is_private(secure: Stack) -> None:
    d = secure.data_dir
    assert mode(d) == 0o700
    for name in ("eaglenest.db", "broker.aof", "broker.json", "broker.conf", "broker.password",
                 "broker.log"):
        path = d / name
        if path.exists():
            assert mode(path) == 0o600, name
    assert (d / "broker.password").exists() and (d / "eaglenest.db").exists()


def test_broker_needs_its_password(secure: Stack) -> None:
    url = embedded_url(secure.data_dir)
    assert url is not None
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=port, socket_timeout=5).ping()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=port, password="guess", socket_timeout=5).ping()
    r = redis.Redis.from_url(url, socket_timeout=5)
    assert r.ping()
    for command in (("CONFIG", "SET", "dir", "/tmp"), ("CONFIG", "GET", "requirepass"),
                    ("DEBUG", "SLEEP", "0"), ("MODULE", "LOAD", "/tmp/evil.so"),
                    ("REPLICAOF", "attacker", "6379")):
        with pytest.raises(redis.ResponseError, match="unknown command"):
            r.execute_command(*command)
    # the password is on no command line (every local user reads /proc/<pid>/cmdline)
    import psutil

    password = url.split(":")[2].split("@")[0]
    for proc in psutil.process_iter(["cmdline"]):
        assert password not in " ".join(proc.info["cmdline"] or [])


def test_up_warns_about_a_readable_credentials_file(tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    creds.write_text("[eaglenest]\naws_access_key_id = AKIAX\naws_secret_access_key = s\n")
    os.chmod(creds, 0o644)
    stack = Stack(tmp_path, extra_env={"EAGLENEST_WORKER_QUEUES": ""}).start()
    try:
        assert f"{creds} (mode 644) can be read by other users" in stack.console()
        assert mode(creds) == 0o644  # the operator's file: reported, not changed
        assert mode(tmp_path) == 0o700
    finally:
        stack.stop()


def cp(stack: Stack, src: str, dst: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EAGLENEST_DATA_DIR": str(stack.data_dir),
           "EAGLENEST_ACCOUNT_ID": stack.env()["EAGLENEST_ACCOUNT_ID"]}
    return subprocess.run([sys.executable, "-m", "eaglenest.cli", "s3", "cp", src, dst],
                          env=env, capture_output=True, text=True, cwd=ROOT)


def test_upload_refuses_symlinks(secure: Stack, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "weights.safetensors").symlink_to(secure.data_dir / "broker.password")
    r = cp(secure, str(folder), "s3://linked/model/")
    assert r.returncode == 1
    assert f"{folder / 'weights.safetensors'} is a symbolic link" in r.stderr
    assert not (secure.data_dir / "s3" / "linked").exists()  # nothing uploaded


def test_control_characters_in_keys(secure: Stack, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("x")
    r = cp(secure, str(tmp_path / "f.txt"), "s3://bkt/x\x01y")
    assert r.returncode == 1 and "keys may not contain control characters" in r.stderr
    assert "Traceback" not in r.stderr
    sm = secure.client()
    with pytest.raises(ClientError) as exc:
        sm.create_model(ModelName="nul-key", ExecutionRoleArn=ROLE, PrimaryContainer={
            "Image": "eaglenest", "ModelDataUrl": "s3://bkt/x\x00y"})
    code, message = error_of(exc)
    assert code == "ValidationException"
    assert message.startswith("PrimaryContainer.ModelDataUrl: 's3://bkt/x\\x00y': keys may "
                              "not contain control characters")
    with pytest.raises(ClientError, match="Could not find model"):
        sm.describe_model(ModelName="nul-key")
