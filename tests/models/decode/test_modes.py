"""Decode modes: the engines switch on a mode's traits (DecodeMode.spec), never its name."""

from __future__ import annotations

import ast
from pathlib import Path

from eaglenest.models.decode.modes import MODES, SPECULATIVE_MODES, DecodeMode

DECODE = Path(__file__).resolve().parents[3] / "models" / "decode"


def test_every_mode_has_traits_and_the_speculative_ones_are_listed_in_order():
    assert set(MODES) == set(DecodeMode)
    assert SPECULATIVE_MODES == ("chain", "tree", "parallel", "block")
    assert not DecodeMode.PLAIN.spec.drafts
    assert [m for m in DecodeMode if m.spec.tree] == [DecodeMode.TREE]
    assert [m for m in DecodeMode if m.spec.parallel] == [DecodeMode.PARALLEL]
    assert [m for m in DecodeMode if m.spec.block] == [DecodeMode.BLOCK]
    assert DecodeMode.TREE.spec.adaptive_k_min == 1  # a tree always drafts
    assert DecodeMode.CHAIN.spec.adaptive_k_min == DecodeMode.PARALLEL.spec.adaptive_k_min == 0
    assert DecodeMode.BLOCK.spec.adaptive_k_min == 0
    assert DecodeMode.BLOCK.spec.adaptive_k_max == 15  # block_size 16 - 1, the recipes' size


def test_the_engines_do_not_compare_modes_by_name():
    """``self.mode is DecodeMode.TREE`` in an engine is a switch the traits replace."""
    offenders = []
    for name in ("engine.py", "batch.py", "batch_draft.py", "block.py", "drafter.py"):
        tree = ast.parse((DECODE / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(
                    isinstance(c, ast.Attribute) and isinstance(c.value, ast.Name)
                    and c.value.id == "DecodeMode" for c in [node.left, *node.comparators]):
                offenders.append(f"{name}:{node.lineno}")
    assert not offenders, offenders
