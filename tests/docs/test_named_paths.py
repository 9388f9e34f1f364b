"""Every repository path named in a docstring, a comment or a document exists.

A path is a word that starts with one of the repository's top-level folders and ends in a
file name with an extension (`api/runtime/capture.py`, `docs/gpu-hosts.md`); the
`eaglenest/` prefix (the link folder the packages are imported through) is read as the
repository root. Paths with placeholders (`<kind>`, `*`) are not checked.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("api", "cli", "db", "foundation", "models", "workers", "migrations", "docker", "tests",
           "docs", "scripts", "benchmarks", "requirements", ".ci")
#: a path: a top-level folder, then segments, ending in `name.ext`
_TOPS = "|".join(re.escape(f) for f in FOLDERS)
PATH = re.compile(rf"(?<![\w./<-])(?:eaglenest/)?((?:{_TOPS})/[\w./-]*\.(?:py|md|sh|yml|"
                  r"yaml|json|toml|svg|txt|ini|cfg))(?![\w/<*]|\.\w)")
SOURCES = ("api", "cli", "db", "foundation", "models", "workers", "migrations", "tests", "scripts",
           "benchmarks", "docs", "docker", ".ci")


def _files() -> list[Path]:
    out = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "docker-compose.yml"]
    for top in SOURCES:
        for p in sorted((ROOT / top).rglob("*")):
            if p.is_file() and p.suffix in (".py", ".md", ".sh", ".yml", ".toml", "") \
                    and "__pycache__" not in p.parts and p.stat().st_size < 2_000_000:
                out.append(p)
    return out


def _texts() -> list[tuple[Path, str]]:
    """(file, its text) of every file checked (files that are not text are left out)."""
    out = []
    for f in _files():
        try:
            out.append((f, f.read_text()))
        except UnicodeDecodeError:
            continue
    return out


def named_paths(text: str) -> set[str]:
    return {m.group(1).rstrip(".") for m in PATH.finditer(text)}


def test_the_pattern_finds_paths_and_skips_placeholders() -> None:
    text = ("see api/runtime/capture.py, eaglenest/db/repository.py and `docs/gpu-hosts.md`; "
            "not models/heads/<kind>.py nor tests/**/*.py nor xapi/a.py")
    assert named_paths(text) == {"api/runtime/capture.py", "db/repository.py", "docs/gpu-hosts.md"}


def test_every_named_path_exists() -> None:
    missing: list[str] = []
    for f, text in _texts():
        for path in sorted(named_paths(text)):
            if not (ROOT / path).exists():
                missing.append(f"{f.relative_to(ROOT)}: {path}")
    assert not missing, "paths named that do not exist:\n" + "\n".join(missing)


#: a dotted name of our code: `eaglenest.api.runtime.capture` or `eaglenest.db.repository.now`
DOTTED = re.compile(r"\beaglenest\.((?:api|cli|db|foundation|models|workers)(?:\.\w+)+)")


def dotted_problem(name: str) -> str | None:
    """Why `name` names nothing: its longest module prefix must exist, and the next part (a
    module, class, function or constant) must be written in that module."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else \
            base / "__init__.py" if (base / "__init__.py").is_file() else None
        if module is None:
            continue
        rest = parts[n:]
        if rest and not re.search(rf"\b{re.escape(rest[0])}\b", module.read_text()):
            return f"{rest[0]} is not in {module.relative_to(ROOT)}"
        return None
    return "no such module"


def test_every_dotted_name_exists() -> None:
    missing: list[str] = []
    for f, text in _texts():
        for name in sorted({m.group(1) for m in DOTTED.finditer(text)}):
            why = dotted_problem(name)
            if why:
                missing.append(f"{f.relative_to(ROOT)}: eaglenest.{name} ({why})")
    assert not missing, "dotted names of nothing:\n" + "\n".join(missing)


#: in prose (docstrings, comments, documents) the prefix is often left out: `api.app`
BARE = re.compile(r"(?<![\w./-])((?:api|cli|db|foundation|models|workers)(?:\.[a-z_]\w*)+)"
                  r"(?![\w(/-])")


def prose(f: Path) -> str:
    """A Python file's docstrings and comments; any other file whole."""
    text = f.read_text()
    if f.suffix != ".py":
        return text
    tree = ast.parse(text)
    docs = [ast.get_docstring(n) or "" for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline)
                if t.type == tokenize.COMMENT]
    return "\n".join(docs + comments)


def test_every_module_named_in_prose_exists() -> None:
    missing: list[str] = []
    for f in _files():
        if f.suffix not in (".py", ".md"):
            continue
        for name in sorted({m.group(1).rstrip(".") for m in BARE.finditer(prose(f))}):
            why = dotted_problem(name)
            if why:
                missing.append(f"{f.relative_to(ROOT)}: {name} ({why})")
    assert not missing, "modules named in prose that do not exist:\n" + "\n".join(missing)
