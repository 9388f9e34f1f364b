"""The README's first command on a fresh virtualenv: `bash scripts/up.sh` installs the service
lock (requirements/service.txt) and nothing else, every module of the service imports from
it, and `eaglenest up` runs with both children alive and no restart."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from eaglenest.workers.infra.broker import free_port

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("eaglenest.foundation", "eaglenest.db", "eaglenest.models", "eaglenest.api",
            "eaglenest.workers")
IMPORT_ALL = """
import importlib, pkgutil, sys
failed, count = [], 0
for top in sys.argv[1:]:
    package = importlib.import_module(top)
    for info in pkgutil.walk_packages(package.__path__, top + "."):
        if info.name.endswith("__main__"):
            continue  # importing it runs the program
        count += 1
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # report every failure, not just the first
            failed.append(f"{info.name}: {type(exc).__name__}: {exc}")
print(f"imported {count} modules")
sys.exit("\\n".join(failed) if failed else 0)
"""


def children_of(pid: int) -> list[str]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, ValueError, IndexError):
            continue
    return found


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fresh") / "venv"


def test_up_sh_installs_a_fresh_venv_and_serves(fresh_venv: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EAGLENEST_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(EAGLENEST_VENV=str(fresh_venv), EAGLENEST_DATA_DIR=str(tmp_path / "data"),
               EAGLENEST_WORKER_QUEUES="default,train,serve")
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["bash", "scripts/up.sh", "--port", str(port)], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 900  # a cold pip cache downloads torch and friends
        while "EagleNest is listening" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
            time.sleep(0.5)
        first_line, second_line = log.read_text(errors="replace").splitlines()[:2]
        assert first_line.startswith(f"EagleNest: virtualenv {fresh_venv}"), first_line
        # a line while pip installs, then a quiet console: Celery's banner and library
        # warnings go to the data dir's log file (workers/infra/console.py)
        assert second_line.startswith("EagleNest: installing requirements/service.txt into")
        # the worker's banner, in the data dir's log file once Celery is up (a fresh venv
        # compiles every module it imports: that can take longer than the API's start)
        data_log = tmp_path / "data" / "eaglenest.log"
        banner = time.monotonic() + 60
        while " -------------- [queues]" not in data_log.read_text(errors="replace"):
            assert time.monotonic() < banner, data_log.read_text(errors="replace")[-4000:]
            time.sleep(0.5)
        time.sleep(5)  # long enough for a crash-looping child to show
        kids = children_of(proc.pid)
        assert any("eaglenest.cli api" in k for k in kids), kids
        assert any("eaglenest.cli worker" in k for k in kids), kids
        text = log.read_text(errors="replace")
        assert " -------------- " not in text and "SecurityWarning" not in text, text[-4000:]
        text += data_log.read_text(errors="replace")
        assert "restarting" not in text and "Traceback" not in text, text[-4000:]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=90)
    assert proc.returncode == 0, log.read_text(errors="replace")[-4000:]

    python = fresh_venv / "bin" / "python"
    done = subprocess.run([str(python), "-c", IMPORT_ALL, *PACKAGES], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert int(done.stdout.split()[1]) > 100, done.stdout
    # the service lock and nothing more: no test tools, no vLLM
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, check=True).stdout.lower()
    assert "pytest==" not in listed and "vllm" not in listed, listed
