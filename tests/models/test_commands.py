from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from eaglenest.models.commands import main, register


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="command", required=True))
    return p


def test_register_adds_both_commands() -> None:
    args = parser().parse_args(
        [
            "train",
            "--target",
            "t",
            "--data",
            "d",
            "--head",
            "peagle",
            "--out",
            "o",
            "--max-steps",
            "3",
            "--resume",
        ]
    )
    assert args.head == "peagle" and args.max_steps == 3 and args.resume and callable(args.func)
    args = parser().parse_args(["prepare-target", "--out", "x"])
    assert callable(args.func)


def test_train_command(tiny_dir, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    target = tiny_dir("LlamaForCausalLM")
    rc = main(
        [
            "train",
            "--target",
            str(target),
            "--data",
            "ultrachat_0_8k_515292.jsonl",
            "--head",
            "eagle3",
            "--out",
            str(tmp_path / "h"),
            "--max-steps",
            "2",
            "--draft-vocab-size",
            "64",
            "--max-samples",
            "4",
            "--muon-ns-dtype",
            "bfloat16",
            "--num-layers",
            "2",
            "--quiet",
        ]
    )
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 2 and len(summary["step_accuracy"]) == 3
    assert (tmp_path / "h" / "config.json").is_file()
    provenance = json.loads((tmp_path / "h" / "provenance.json").read_text())
    assert provenance["train_config"]["muon_ns_dtype"] == "bfloat16"
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2


def test_train_command_dflash_flags(tiny_dir, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """The --dflash-* flags reach the head: its config.json holds the block and layers."""
    target = tiny_dir("LlamaForCausalLM")
    rc = main(["train", "--target", str(target), "--data", "ultrachat_0_8k_515292.jsonl",
               "--head", "dflash", "--out", str(tmp_path / "h"), "--max-steps", "2",
               "--draft-vocab-size", "64", "--max-samples", "4", "--quiet",
               "--dflash-block-size", "5", "--dflash-layers", "2", "--dflash-gamma", "2.5",
               "--dflash-anchors", "4", "--dflash-variable-prefix"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 2 and len(summary["step_accuracy"]) == 4  # slots 1..4
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2
    assert config["dflash_config"]["block_size"] == 5
    train_config = json.loads((tmp_path / "h" / "provenance.json").read_text())["train_config"]
    assert train_config["dflash_gamma"] == 2.5 and train_config["dflash_anchors"] == 4
    assert train_config["dflash_variable_prefix"] is True


def test_train_command_reports_bad_data(tiny_dir, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    rc = main(
        [
            "train",
            "--target",
            str(tiny_dir("LlamaForCausalLM")),
            "--data",
            str(bad),
            "--out",
            str(tmp_path / "h"),
            "--quiet",
        ]
    )
    assert rc == 2
    assert f"{bad}:1:" in capsys.readouterr().err


def test_train_command_reports_missing_files(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    rc = main(
        [
            "train",
            "--target",
            str(tmp_path),
            "--data",
            "magicoder.jsonl",
            "--out",
            str(tmp_path / "h"),
            "--quiet",
        ]
    )
    assert rc == 2 and "config.json" in capsys.readouterr().err
