"""The `eaglenest` command's argument parser: every option's help ends with its default.

`Parser` is the class of every parser and subparser of the command (add_subparsers passes
its own class on), the lazily parsed torch subcommands (train, prepare-target, generate)
included, so `eaglenest <command> --help` shows each default the same way.
"""

from __future__ import annotations

import argparse
from typing import Any


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`(default: X)` after an option's help, unless its text already says what the default
    is, the option is required, or it is a switch (off unless given)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text or action.required or action.default is None
                or action.nargs == 0):
            return text
        return str(super()._get_help_string(action))


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
