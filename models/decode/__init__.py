"""Embedded speculative decoding: chain, EAGLE-2 dynamic tree and P-EAGLE parallel drafting,
greedy and rejection-sampling verification, adaptive depth (see engine.py).

``modes`` imports no torch; the engine classes below are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from eaglenest.models.decode.modes import DecodeMode

if TYPE_CHECKING:
    from eaglenest.models.decode.engine import SpeculativeEngine
    from eaglenest.models.decode.stats import SpecStats

_LAZY = {"SpecStats": "stats", "SpeculativeEngine": "engine"}
__all__ = ["DecodeMode", "SpecStats", "SpeculativeEngine"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
