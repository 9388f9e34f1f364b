"""Decode modes (torch-free, so workers and CLIs name them without loading torch)."""

from __future__ import annotations

from enum import StrEnum


class DecodeMode(StrEnum):
    PLAIN = "plain"
    CHAIN = "chain"
    TREE = "tree"
    PARALLEL = "parallel"
