"""Embedded speculative decoding: chain, EAGLE-2 dynamic tree and P-EAGLE parallel drafting,
greedy and rejection-sampling verification, adaptive depth (see engine.py)."""

from models.decode.engine import DecodeMode, SpeculativeEngine
from models.decode.stats import SpecStats

__all__ = ["DecodeMode", "SpecStats", "SpeculativeEngine"]
