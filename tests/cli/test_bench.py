"""`eaglenest bench --kernel-cache`: the embedded servers' kernel timing cache is the data
dir's (the one jobs' and endpoints' servers share) unless told otherwise."""

from __future__ import annotations

from pathlib import Path

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
