"""The credentials file (issue #35, finding 6): one access key id under two profiles is
refused wherever the file is loaded, naming both profiles (the CLI stops with exit 1; the
API refuses that key and serves the others); every write EagleNest makes leaves the file
0600, even one that was 0644."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from eaglenest.foundation.settings import CredentialsError, Settings, read_keys
from eaglenest.workers.infra.credentials import ensure_credentials
from tests.security.asgi_api import InProcessApi

ROOT = Path(__file__).resolve().parents[2]
DUP = "AKIADUPLICATED000001"
ALICE, BOB, CAROL = "111111111111", "222222222222", "333333333333"


def profile(name: str, key: str, secret: str, account: str) -> str:
    return (f"[{name}]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"
            f"eaglenest_account_id = {account}\n")


#: carol's key is fine; alice's key id was pasted into bob's profile by hand
DUPLICATED = (profile("alice", DUP, "alice-secret", ALICE)
              + profile("carol", "AKIACAROL00000000001", "carol-secret", CAROL)
              + profile("bob", DUP, "bob-secret", BOB))


@pytest.fixture(autouse=True)
def no_environment_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EAGLENEST_ACCESS_KEY_ID", "EAGLENEST_SECRET_ACCESS_KEY", "EAGLENEST_DATA_DIR",
                 "EAGLENEST_DATABASE_URL", "EAGLENEST_S3_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)


def keys_cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLENEST_")}
    return subprocess.run([sys.executable, "-m", "eaglenest.cli", "keys", *args,
                           "--data-dir", str(data_dir)],
                          env=env, capture_output=True, text=True, cwd=ROOT, check=False)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_read_keys_refuses_a_key_id_under_two_profiles(tmp_path: Path) -> None:
    path = tmp_path / "credentials"
    path.write_text(DUPLICATED)
    with pytest.raises(CredentialsError) as exc:
        read_keys(path, "000000000000")
    assert "'alice'" in str(exc.value) and "'bob'" in str(exc.value) and DUP in str(exc.value)
    assert list(exc.value.usable) == ["AKIACAROL00000000001"]  # what the API keeps serving
    assert isinstance(exc.value, ValueError)


def test_cli_refuses_the_file_naming_both_profiles(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "credentials").write_text(DUPLICATED)
    listed = keys_cli(data, "list")
    assert listed.returncode == 1, listed.stdout
    assert "'alice'" in listed.stderr and "'bob'" in listed.stderr and DUP in listed.stderr
    assert listed.stderr.startswith("eaglenest: error: ") and "Traceback" not in listed.stderr
    assert listed.stdout == ""  # no key listed as if the file were fine

    created = keys_cli(data, "create", "--name", "dave")
    assert created.returncode == 1 and "'bob'" in created.stderr
    assert (data / "credentials").read_text() == DUPLICATED  # nothing written

    # revoking one of the two profiles is how it is fixed; then the file loads again
    revoked = keys_cli(data, "revoke", "bob")
    assert revoked.returncode == 0, revoked.stderr
    listed = keys_cli(data, "list")
    assert listed.returncode == 0, listed.stderr
    assert [line.split() for line in listed.stdout.splitlines()] == [
        ["alice", DUP, ALICE], ["carol", "AKIACAROL00000000001", CAROL]]


def test_revoking_a_duplicated_key_id_removes_it_from_every_profile(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "credentials").write_text(DUPLICATED)
    revoked = keys_cli(data, "revoke", DUP)
    assert revoked.returncode == 0, revoked.stderr
    assert revoked.stdout.strip() == "revoked: alice, bob"
    assert DUP not in (data / "credentials").read_text()


def test_api_refuses_the_duplicated_key_and_serves_the_others(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    data.mkdir()
    creds = data / "credentials"
    creds.write_text(profile("alice", DUP, "alice-secret", ALICE)
                     + profile("carol", "AKIACAROL00000000001", "carol-secret", CAROL))
    api = InProcessApi(data)
    ok = api.call("ListModels", {}, DUP, "alice-secret")
    assert ok.status_code == 200, ok.text

    creds.write_text(DUPLICATED)  # hand-edited while the API runs
    with caplog.at_level(logging.ERROR, logger="eaglenest.api"):
        for secret in ("alice-secret", "bob-secret"):  # neither account is acted for
            r = api.call("CreateModel", {"ModelName": "m", "ExecutionRoleArn":
                                         "arn:aws:iam::123456789012:role/R",
                                         "PrimaryContainer": {"Image": "eaglenest"}},
                         DUP, secret)
            assert r.status_code == 403, r.text
            assert r.json()["__type"] == "UnrecognizedClientException"
    logged = " ".join(rec.getMessage() for rec in caplog.records)
    assert "'alice'" in logged and "'bob'" in logged and DUP in logged
    carol = api.call("ListModels", {}, "AKIACAROL00000000001", "carol-secret")
    assert carol.status_code == 200 and carol.json()["Models"] == []
    with sqlite3.connect(data / "eaglenest.db") as db:  # no model in any account
        assert db.execute("SELECT count(*) FROM models").fetchone() == (0,)


def test_keys_create_and_revoke_leave_a_0644_file_0600(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    creds = data / "credentials"
    creds.write_text(profile("eaglenest", "AKIAFIRST00000000001", "first-secret", ALICE))
    creds.chmod(0o644)
    created = keys_cli(data, "create", "--name", "dave", "--new-account")
    assert created.returncode == 0, created.stderr
    assert mode(creds) == 0o600
    assert f"{creds} was mode 644" in created.stderr
    creds.chmod(0o644)
    revoked = keys_cli(data, "revoke", "dave")
    assert revoked.returncode == 0, revoked.stderr
    assert mode(creds) == 0o600


def test_first_start_leaves_an_existing_0644_file_0600(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    creds = data / "credentials"
    creds.write_text("")  # placed by the operator, no key yet
    creds.chmod(0o644)
    key, created = ensure_credentials(Settings(data_dir=data))
    assert created and key in creds.read_text()
    assert mode(creds) == 0o600
