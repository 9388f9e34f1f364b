"""One data dir per user wherever the command runs: `--data-dir`, then EAGLENEST_DATA_DIR,
then `$XDG_DATA_HOME/eaglenest`, else `~/.local/share/eaglenest`, never the current
directory. `migrate` (like up/api/worker) creates an EagleNest there; `s3` and `status`
refuse a data dir without one, name it and say how to choose another, and create nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from eaglenest.foundation.settings import Settings, default_data_dir


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    (tmp_path / "elsewhere").mkdir()
    return tmp_path / "home"


def eaglenest(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`eaglenest ARGS` from a directory that is not the data dir, as a user with HOME."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("EAGLENEST_") and k != "XDG_DATA_HOME"}
    return subprocess.run([sys.executable, "-m", "eaglenest.cli", *args],
                          env={**base, "HOME": str(home), **env}, cwd=home.parent / "elsewhere",
                          capture_output=True, text=True, timeout=120)


def test_default_is_per_user_and_never_the_current_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("EAGLENEST_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    assert Settings().data_dir == tmp_path / ".local/share/eaglenest"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/dir")  # the XDG spec: ignore relative ones
    assert default_data_dir() == tmp_path / ".local/share/eaglenest"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert Settings().data_dir == tmp_path / "xdg/eaglenest"
    monkeypatch.setenv("EAGLENEST_DATA_DIR", str(tmp_path / "env"))
    assert Settings().data_dir == tmp_path / "env"


@pytest.mark.parametrize("how, where", [
    ("default", ".local/share/eaglenest"),
    ("xdg", "xdg/eaglenest"),
    ("env", "env-dir"),
    ("flag", "flag-dir")])  # the flag wins over the variable
def test_migrate_creates_the_chosen_data_dir(home, how, where):
    env = {}
    if how != "default":
        env["XDG_DATA_HOME"] = str(home / "xdg")
    if how in ("env", "flag"):
        env["EAGLENEST_DATA_DIR"] = str(home / "env-dir")
    args = ["--data-dir", str(home / "flag-dir")] if how == "flag" else []
    r = eaglenest(home, "migrate", *args, **env)
    assert r.returncode == 0, r.stderr
    made = sorted(p.relative_to(home).as_posix() for p in home.rglob("eaglenest.db"))
    assert made == [f"{where}/eaglenest.db"]
    assert not list((home.parent / "elsewhere").iterdir())


@pytest.mark.parametrize("args", [
    ["status"], ["s3", "ls", "s3://models/"], ["s3", "cp", "s3://models/x", "x"],
    ["s3", "cp", "../home/model.bin", "s3://models/m/"]])
def test_commands_that_read_an_eaglenest_refuse_an_empty_data_dir(home, args):
    (home / "model.bin").write_bytes(b"weights")
    r = eaglenest(home, *args)
    data_dir = home / ".local/share/eaglenest"
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"no EagleNest in the data dir {data_dir}: no database (eaglenest.db)" in r.stderr
    assert "--data-dir DIR or EAGLENEST_DATA_DIR=DIR" in r.stderr
    assert "eaglenest up" in r.stderr and not r.stdout
    assert not (home / ".local").exists()  # nothing created
    assert not list((home.parent / "elsewhere").iterdir())


def test_s3_and_status_use_the_one_data_dir_from_anywhere(home):
    assert eaglenest(home, "migrate").returncode == 0
    src = home / "model.bin"
    src.write_bytes(b"weights")
    r = eaglenest(home, "s3", "cp", str(src), "s3://models/m/")
    assert r.returncode == 0, r.stderr
    assert (home / ".local/share/eaglenest/s3/models/m/model.bin").read_bytes() == b"weights"
    r = eaglenest(home, "s3", "ls", "s3://models/")
    assert r.stdout.splitlines() == ["s3://models/m/model.bin"], r.stderr
    r = eaglenest(home, "status")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == [
        f"data dir: {home / '.local/share/eaglenest'}", "jobs: none"]


def test_status_fails_when_the_database_cannot_be_read(home):
    r = eaglenest(home, "status",
                  EAGLENEST_DATABASE_URL=f"sqlite:///{home}/no/such/dir/eaglenest.db")
    assert r.returncode == 1
    assert "database: unreachable (OperationalError" in r.stdout
