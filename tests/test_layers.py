"""The floors of the house hold, and the contracts beside it: `lint-imports` (contracts in
.importlinter) passes, every contract there is checked and kept, and every folder of tests/
and benchmarks/ that holds Python is a package the contracts can see."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: folders of tests/ and benchmarks/ that hold Python but are no package, so no contract
#: sees their imports: each with the reason it may stay so
NOT_PACKAGES = {
    "tests/peer": "moto's pytest plugin, loaded by path by scripts/peer_suite.sh",
    "benchmarks/speculators_cpu": "scripts run in the speculators venv, not ours",
}


def _lint_imports() -> str:
    beside = Path(sys.executable).with_name("lint-imports")
    exe = str(beside) if beside.exists() else shutil.which("lint-imports")
    assert exe, "lint-imports not found (the dev extra installs import-linter)"
    return exe


def _config() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    return config


def test_import_contracts_are_kept():
    r = subprocess.run([_lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout
    config = _config()
    names = [config[s]["name"] for s in config.sections()
             if s.startswith("importlinter:contract:")]
    assert len(names) >= 5, names
    lines = set(r.stdout.splitlines())
    assert not [n for n in names if f"{n} KEPT" not in lines], r.stdout


def test_the_contracts_cover_benchmarks_and_tests():
    roots = _config()["importlinter"]["root_packages"].split()
    assert set(roots) == {"eaglenest", "benchmarks", "tests"}, roots


def test_every_folder_of_python_in_tests_and_benchmarks_is_a_package():
    """grimp reads packages only: a folder without __init__.py is outside every contract
    (a test there could import benchmarks unseen)."""
    holding = {p.parent for top in ("tests", "benchmarks") for p in (ROOT / top).rglob("*.py")
               if "__pycache__" not in p.parts}
    missing = sorted(str(d.relative_to(ROOT)) for d in holding
                     if not (d / "__init__.py").is_file())
    assert missing == sorted(NOT_PACKAGES), missing
