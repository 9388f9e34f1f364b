"""Embedded speculative decoding: chain, EAGLE-2 dynamic tree and P-EAGLE parallel drafting,
greedy and rejection-sampling verification, adaptive depth (see engine.py).

The names below are imported on first use, so that `eaglenest.models.decode.cli` (the
`generate` command's parser) is importable without torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eaglenest.models.decode.engine import DecodeMode, SpeculativeEngine
    from eaglenest.models.decode.stats import SpecStats

__all__ = ["DecodeMode", "SpecStats", "SpeculativeEngine"]
_HOME = {"DecodeMode": "engine", "SpeculativeEngine": "engine", "SpecStats": "stats"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
