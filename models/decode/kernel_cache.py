"""Host facts and the JSON cache of linear-kernel timings (models/decode/kernels.py).

The cache file ``<cache_dir>/linear-kernels.json`` maps a key to the timings measured
under it: ``{"version": 1, "entries": {key: {candidate: {rows: ms}}}}``. A key names the
host (CPU model, torch version, torch threads) and one linear family (its shapes and
dtype), so a timing is reused only where it would come out the same; the weights' values
play no part in a linear's speed. A file that does not parse as that format is ignored
(logged) and replaced on the next write; writes go through a temporary file and a rename.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger("eaglenest.models.decode.kernels")

FILE_NAME = "linear-kernels.json"
VERSION = 1

Timings = dict[str, dict[int, float]]  # candidate -> rows -> milliseconds


@cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    return fields


def cpu_model() -> str:
    info = _cpuinfo()
    return info.get("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_has_bf16() -> bool:
    """True where the CPU has bfloat16 dot-product units (AVX512-BF16 or AMX-BF16)."""
    flags = set(_cpuinfo().get("flags", "").split())
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def host_key() -> str:
    return f"{cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def family_key(host: str, family: str, shapes: list[tuple[int, int]], dtype: str) -> str:
    """The cache key of one family's timings: host, family name, its linears' shapes."""
    digest = hashlib.sha256(json.dumps(sorted(shapes)).encode()).hexdigest()[:16]
    return f"{host} | {family} {len(shapes)}x{digest} {dtype}"


def _parse(raw: object) -> dict[str, Timings] | None:
    if not isinstance(raw, dict) or raw.get("version") != VERSION:
        return None
    entries = raw.get("entries")
    if not isinstance(entries, dict):
        return None
    out: dict[str, Timings] = {}
    for key, per_candidate in entries.items():
        if not isinstance(per_candidate, dict):
            return None
        out[key] = {
            str(c): {int(r): float(ms) for r, ms in rows.items()}
            for c, rows in per_candidate.items()
        }
    return out


def load(cache_dir: Path | None) -> dict[str, Timings]:
    """Every cached entry ({} without a cache, a file or with a corrupt one)."""
    if cache_dir is None:
        return {}
    path = cache_dir / FILE_NAME
    try:
        parsed = _parse(json.loads(path.read_text()))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, AttributeError):
        parsed = None
    if parsed is None:
        log.warning("ignoring unreadable linear-kernel cache %s (it will be rewritten)", path)
        return {}
    return parsed


def save(cache_dir: Path | None, entries: dict[str, Timings]) -> None:
    if cache_dir is None:
        return
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / FILE_NAME
    body = {"version": VERSION, "entries": {
        key: {c: {str(r): ms for r, ms in rows.items()} for c, rows in t.items()}
        for key, t in entries.items()
    }}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True))
    os.replace(tmp, path)
