"""`eaglenest bench`: the embedded servers' kernel timing cache is the data dir's (the one
jobs' and endpoints' servers share) unless told otherwise; the decodings measured are the
head kind's unless --decodings names others, checked as a job's; the rounds' options."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglenest.cli import bench
from eaglenest.cli.parsing import Parser


def parse(*extra: str) -> Path | None:
    parser = Parser(prog="eaglenest")
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["bench", "--target", "t", "--head", "h", *extra])
    return bench._kernel_cache(args)


def test_default_is_the_data_dirs_kernel_cache(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    assert parse("--data-dir", str(tmp_path)) == tmp_path.resolve() / "kernels"
    monkeypatch.setenv("EAGLENEST_DATA_DIR", str(tmp_path / "env"))
    assert parse() == (tmp_path / "env").resolve() / "kernels"


def test_a_folder_or_none(tmp_path: Path) -> None:
    assert parse("--kernel-cache", str(tmp_path / "k")) == tmp_path / "k"
    assert parse("--kernel-cache", "none") is None


def decodings(head: Path, *extra: str) -> tuple[str, tuple[str, ...]]:
    parser = Parser(prog="eaglenest")
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["bench", "--target", "t", "--head", str(head), *extra])
    return bench._decodings(args, args.backend or "embedded")


def test_decodings_default_to_the_head_kinds_and_are_checked(tmp_path: Path) -> None:
    """--decodings as EAGLENEST_BENCH_DECODINGS: unset, the head kind's (read from its
    config.json: here a native EAGLE-3 layout) on the backend; a name the head cannot run
    stops the command naming it."""
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    assert decodings(head) == ("chain", ("chain", "tree", "chain+adaptive"))
    assert decodings(head, "--backend", "vllm") == ("chain", ("chain",))
    assert decodings(head, "--decodings", "tree,chain") == ("chain", ("tree", "chain"))
    with pytest.raises(SystemExit) as exc:
        decodings(head, "--decodings", "chain,parallel")
    assert str(exc.value) == (
        "eaglenest bench: --decodings / --head: parallel drafting needs a head with mask "
        "slots (HeadSpec.parallel); EAGLE-3 heads have none")


def test_rounds_options_are_ranged() -> None:
    parser = Parser(prog="eaglenest")
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["bench", "--target", "t", "--head", "h", "--max-rounds", "4",
                              "--minutes", "2.5"])
    assert (args.rounds, args.max_rounds, args.minutes) == (2, 4, 2.5)
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--target", "t", "--head", "h", "--max-rounds", "21"])
