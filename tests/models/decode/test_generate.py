"""`generate` subcommand on a tiny target with a saved head."""

from __future__ import annotations

import argparse

from eaglenest.models.checkpoint import save_head
from eaglenest.models.decode import generate


def test_generate_command(tmp_path, tiny_dir, llama, make_head, capsys) -> None:  # noqa: ANN001
    head_dir = save_head(make_head(llama, "peagle"), tmp_path / "head")
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    generate.register(sub)
    for mode in ("chain", "tree", "parallel"):
        args = parser.parse_args([
            "generate", "--target", str(tiny_dir("LlamaForCausalLM")), "--head", str(head_dir),
            "--prompt", "def add(a, b):", "--mode", mode, "--k", "3", "--max-new-tokens", "6",
            "--adaptive",
        ])
        assert args.func(args) == 0
        out = capsys.readouterr().out
        assert f"[{mode}]" in out and "tok/s" in out and "acceptance length" in out
    args = parser.parse_args(["generate", "--target", str(tiny_dir("LlamaForCausalLM")),
                              "--prompt", "hi", "--max-new-tokens", "4", "--temperature", "0.7",
                              "--seed", "1"])
    assert args.func(args) == 0 and "[plain]" in capsys.readouterr().out


def test_generate_block_head_defaults_to_block_mode(tmp_path, tiny_dir, llama, make_head,  # noqa: ANN001
                                                    capsys) -> None:
    """No --mode: a saved DFlash head decodes in its own mode (block), K capped at its
    block_size - 1."""
    head_dir = save_head(make_head(llama, "dflash"), tmp_path / "dflash")
    parser = argparse.ArgumentParser()
    generate.register(parser.add_subparsers())
    args = parser.parse_args(["generate", "--target", str(tiny_dir("LlamaForCausalLM")),
                              "--head", str(head_dir), "--prompt", "def add(a, b):",
                              "--k", "30", "--max-new-tokens", "6"])
    engine, _ = generate.build_engine(args)
    assert engine.mode.value == "block" and engine.k == 7  # default block_size 8
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "[block]" in out and "acceptance length" in out


def test_generate_no_onednn_keeps_stock_linears(tiny_dir) -> None:  # noqa: ANN001
    parser = argparse.ArgumentParser()
    generate.register(parser.add_subparsers())
    base = ["generate", "--target", str(tiny_dir("LlamaForCausalLM")), "--prompt", "hi"]
    stock, _ = generate.build_engine(parser.parse_args([*base, "--no-onednn"]))
    packed, _ = generate.build_engine(parser.parse_args(base))
    assert not any(type(m).__name__ == "OneDNNLinear" for m in stock.model.modules())
    assert any(type(m).__name__ == "OneDNNLinear" for m in packed.model.modules())
