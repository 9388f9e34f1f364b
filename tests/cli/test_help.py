"""`eaglenest` help: every option of every subcommand (the lazily parsed torch ones too) has
help text that shows its default; `<command> --help` never imports torch (checked with
`python -X importtime` on the real command, not by wall time); `eaglenest --version`."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from eaglenest import __version__
from eaglenest.cli.main import _LAZY, build_parser
from eaglenest.cli.parsing import HelpFormatter, Parser

COMMANDS = ["up", "api", "worker", "migrate", "keys", "keys create", "keys list",
            "keys revoke", "s3", "s3 cp", "s3 ls", "s3 owner", "status", "bench", "train",
            "prepare-target", "generate"]
HEAVY = ("torch", "transformers", "celery", "uvicorn", "fastapi")


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every subcommand's parser as `eaglenest <command> --help` shows it."""
    def walk(prefix: str, parser: argparse.ArgumentParser) -> Iterator:
        for name, child in _children(parser).items():
            if name in _LAZY:
                real = Parser(prog="eaglenest")
                importlib.import_module(_LAZY[name][0]).register(real.add_subparsers())
                child = _children(real)[name]
            yield f"{prefix}{name}", child
            yield from walk(f"{prefix}{name} ", child)
    yield from walk("", build_parser())


def test_every_subcommand_is_covered():
    assert sorted(name for name, _ in parsers()) == sorted(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help_with_its_default(command):
    parser = dict(parsers())[command]
    assert isinstance(parser.formatter_class, type)
    assert issubclass(parser.formatter_class, HelpFormatter), command
    formatter = HelpFormatter("eaglenest")
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "version"):
            continue
        text = formatter._get_help_string(action)
        flag = action.option_strings[-1]
        assert action.help and len(action.help) > 8, (command, flag)
        if not (action.required or action.nargs == 0):  # switches are off unless given
            assert "default" in text, (command, flag, text)


def test_defaults_are_shown_in_the_help_output():
    text = dict(parsers())["worker"].format_help()
    assert "tasks run at once (default: 4)" in text
    assert "(default: train,serve)" in text.replace("\n", " ").replace("  ", "")
    train = " ".join(dict(parsers())["train"].format_help().split())
    assert "training steps (default: 200)" in train and "peak learning rate (default: 0.0003)" in train
    generate = " ".join(dict(parsers())["generate"].format_help().split())
    assert "drafts per step (tree: depth) (default: 4)" in generate


def run_help(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLENEST_")}
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "eaglenest.cli",
                           *args], env=env, capture_output=True, text=True, timeout=120)


def imported(stderr: str) -> set[str]:
    """Module names from `-X importtime` lines: `import time: self | cumulative | name`."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


@pytest.mark.parametrize("command", COMMANDS)
def test_help_does_not_import_torch(command):
    r = run_help(*command.split(), "--help")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(f"usage: eaglenest {command}"), r.stdout[:200]
    modules = imported(r.stderr)
    assert "eaglenest.cli.main" in modules  # the scan sees the imports
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, (command, heavy[:10])


def test_version():
    r = run_help("--version")
    assert r.returncode == 0 and r.stdout == f"eaglenest {__version__}\n"
    assert "torch" not in imported(r.stderr)
