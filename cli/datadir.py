"""The data dir of every subcommand: one option, one resolution, one "is EagleNest there" check.

Resolution order: `--data-dir`, then EAGLENEST_DATA_DIR, then the per-user default
(`$XDG_DATA_HOME/eaglenest`, else `~/.local/share/eaglenest`); never the current directory.
`up`, `api`, `worker` and `migrate` create what is missing there; the commands that read a
running or initialised EagleNest (`s3`, `status`) refuse a data dir without one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eaglenest.foundation.settings import Settings

DATABASE_FILE = "eaglenest.db"


def add_data_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir", default=None, metavar="DIR",
        help="SQLite database, broker, credentials and local artifact store (default: "
             "$EAGLENEST_DATA_DIR, else $XDG_DATA_HOME/eaglenest, else "
             "~/.local/share/eaglenest)")


def settings_for(args: argparse.Namespace) -> Settings:
    """The settings of this invocation, its data dir resolved to an absolute path."""
    settings = Settings()
    chosen = getattr(args, "data_dir", None)
    data_dir = Path(chosen) if chosen else settings.data_dir
    return settings.model_copy(update={"data_dir": data_dir.expanduser().resolve()})


def missing_state(settings: Settings) -> str | None:
    """Why the data dir holds no initialised EagleNest, or None when it does. With
    EAGLENEST_DATABASE_URL set the state lives in that database, not here."""
    if settings.database_url:
        return None
    if not (settings.data_dir / DATABASE_FILE).is_file():
        return f"no database ({DATABASE_FILE}) there"
    return None


def require_eaglenest(settings: Settings, command: str) -> None:
    """Exit 1 with a message naming the data dir when no EagleNest was initialised there;
    creates nothing."""
    why = missing_state(settings)
    if why is None:
        return
    raise SystemExit(
        f"eaglenest {command}: no EagleNest in the data dir {settings.data_dir}: {why}.\n"
        f"Start one there with `eaglenest up`, or point at the data dir of yours with "
        f"--data-dir DIR or EAGLENEST_DATA_DIR=DIR.")
