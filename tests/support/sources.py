"""The repository's own Python files, each once: not through the `eaglenest/` links (they
lead to the same files), not hidden folders (.venv, caches), builds or egg-info."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP = {"eaglenest", "build", "dist", "node_modules"}


def python_files(*, skip: frozenset[str] = frozenset()) -> list[Path]:
    """Relative paths of every .py file, sorted; `skip`: more top-level folders to leave out."""
    out = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in SKIP | skip or any(
                p.startswith(".") or p.endswith(".egg-info") for p in rel.parts):
            continue
        out.append(rel)
    return sorted(out)
