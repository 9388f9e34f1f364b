"""benchmarks/train_heads.py's head specs: kind, start head and per-head recipe variants."""

from __future__ import annotations

import pytest

from benchmarks.train_heads import folder_name, parse_args, parse_head_spec


def test_a_head_spec_names_its_kind_base_and_fields() -> None:
    assert parse_head_spec("peagle") == ("peagle", "", {})
    assert parse_head_spec("peagle@eagle3") == ("peagle", "eagle3", {})
    assert parse_head_spec("peagle@eagle3:num_layers=2:keep_prob=0.5") == (
        "peagle", "eagle3", {"num_layers": 2, "keep_prob": 0.5})
    kind, base, fields = parse_head_spec("peagle:optimizer=adamw:norm_output=false")
    assert fields == {"optimizer": "adamw", "norm_output": False}  # typed like the defaults


def test_a_variant_gets_its_own_folder() -> None:
    assert folder_name("peagle:num_layers=2") == "peagle-num_layers-2"
    assert folder_name("peagle@eagle3") == "peagle@eagle3"
    assert folder_name("peagle") != folder_name("peagle:parallel_depth=3")


def test_an_unknown_field_is_refused() -> None:
    with pytest.raises(SystemExit, match="not_a_field"):
        parse_head_spec("peagle:not_a_field=1")
    with pytest.raises(SystemExit, match="FIELD=VALUE"):
        parse_head_spec("peagle:num_layers")


def test_warm_cache_is_a_flag() -> None:
    assert parse_args(["--warm-cache"]).warm_cache is True
    assert parse_args([]).warm_cache is False
