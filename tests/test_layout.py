"""One import name: the code lives in the top-level folders and is imported only as
`eaglenest.<folder>` (eaglenest/ holds relative symlinks to them); the wheel holds only
the `eaglenest` package."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support import sources

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("api", "db", "models", "workers", "migrations", "foundation", "cli")


def python_files() -> list[Path]:
    """Every .py file of the repository, once (tests/support/sources.py)."""
    return [ROOT / rel for rel in sources.python_files()]


def _bare(module: str) -> bool:
    return module.split(".")[0] in FOLDERS


def bare_references(tree: ast.AST) -> list[tuple[int, str]]:
    """Imports of a bare top-level folder, and `-m <folder>...` / import_module("<folder>...")
    module names (a subprocess or a lazy import that would load a second copy)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _bare(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _bare(node.module):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.List | ast.Tuple):
            items = node.elts
            for flag, value in zip(items, items[1:], strict=False):
                if (isinstance(flag, ast.Constant) and flag.value == "-m"
                        and isinstance(value, ast.Constant) and isinstance(value.value, str)
                        and _bare(value.value)):
                    found.append((node.lineno, f"-m {value.value}"))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and _bare(node.args[0].value)):
            found.append((node.lineno, node.args[0].value))
    return found


def test_the_scan_sees_the_whole_repository():
    files = {p.relative_to(ROOT).parts[0] for p in python_files()}
    assert set(FOLDERS) | {"tests", "benchmarks"} <= files


def test_nothing_imports_a_bare_top_level_folder():
    offenders = [f"{path.relative_to(ROOT)}:{line}: {name}"
                 for path in python_files()
                 for line, name in bare_references(ast.parse(path.read_text(), str(path)))]
    assert not offenders, "import these as eaglenest.<...>:\n" + "\n".join(offenders)


def test_the_scan_catches_bare_names():
    code = ("import models.training.train\nfrom api import app\nfrom .x import y\n"
            "cmd = ['python', '-m', 'workers.cli']\nimportlib.import_module('db.session')\n"
            "from eaglenest.api import app\nimport modelsx\n")
    assert [name for _, name in bare_references(ast.parse(code))] == [
        "models.training.train", "api", "-m workers.cli", "db.session"]


def test_eaglenest_links_every_folder():
    pkg = ROOT / "eaglenest"
    assert (pkg / "__init__.py").is_file()
    for folder in FOLDERS:
        link = pkg / folder
        assert link.is_symlink(), link
        assert str(link.readlink()) == f"../{folder}", "relative, so a checkout anywhere works"
        assert link.resolve() == (ROOT / folder).resolve()


def test_the_wheel_holds_only_eaglenest(tmp_path):
    """Built from a copy of the sources (symlinks kept) so the checkout gets no build/."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "eaglenest", src / "eaglenest", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"eaglenest"}
    for folder in FOLDERS:
        assert f"eaglenest/{folder}/__init__.py" in names
    assert "eaglenest/migrations/script.py.mako" in names
    assert "eaglenest/migrations/versions/0001_initial.py" in names
    assert any(n.startswith("eaglenest/models/data/builtin/") and n.endswith(".jsonl")
               for n in names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    meta = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(meta).split() == [b"eaglenest"]
