"""Embedded speculative decoding: chain, EAGLE-2 dynamic tree and P-EAGLE parallel drafting,
greedy and rejection-sampling verification, adaptive depth (see engine.py)."""

from eaglenest.models.decode.engine import DecodeMode, SpeculativeEngine
from eaglenest.models.decode.stats import SpecStats

__all__ = ["DecodeMode", "SpecStats", "SpeculativeEngine"]
