"""`eaglenest up`'s console and its log file, `<data-dir>/eaglenest.log`.

Contract:
- The log file gets everything: `up`'s own log records, every line its children (API,
  worker) write to stdout or stderr (Celery's banner, library warnings such as py.warnings
  and Celery's SecurityWarning, request and job logs), and whatever `up` prints.
- The console gets what `up` prints (the banner of README.md, why it gives up), `up`'s own
  warnings (a child restarted, the broker restarted: each naming the log file), and of its
  children's lines only errors: a record at ERROR or CRITICAL, the lines that follow it
  until the next record (its traceback), and a bare traceback (an uncaught exception).
- The log file is bounded: past MAX_LOG_BYTES it is renamed `eaglenest.log.1` (replacing
  the previous one) and a new one is started, so at most twice that stays on disk.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import threading
from pathlib import Path
from typing import IO

from eaglenest.foundation.settings import Settings
from eaglenest.workers.infra.logs import make_formatter

#: the log file's name in the data dir
LOG_NAME = "eaglenest.log"
#: the start of a text-format record (workers/infra/logs.py TEXT_FORMAT) and its level
_TEXT_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) ")
_ERRORS = ("ERROR", "CRITICAL")
_UP_LOGGER = "eaglenest.up"
#: the log file's size at which it is rotated (one older file is kept)
MAX_LOG_BYTES = 64 * 1024 * 1024


class UpLog:
    """The log file, appended to line by line from any thread."""

    def __init__(self, path: Path, max_bytes: int = MAX_LOG_BYTES) -> None:
        self.path, self.max_bytes = path, max_bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self._size = self._file.tell()
        self._lock = threading.Lock()

    def _rotate(self) -> None:
        """Under the lock: the full file becomes `<name>.1`, writing goes on in a new one."""
        self._file.close()
        with contextlib.suppress(OSError):
            self.path.replace(self.path.with_name(self.path.name + ".1"))
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._size = self._file.tell()

    def write(self, text: str) -> int:
        """Append `text` (what a logging handler or a relay hands over) and flush: a reader
        of the file sees each line once it is written."""
        with self._lock:
            if not self._file.closed:
                if self._size >= self.max_bytes:
                    self._rotate()
                self._file.write(text)
                self._file.flush()
                self._size += len(text)
        return len(text)

    def flush(self) -> None:
        """Each write flushes already (logging.StreamHandler calls this)."""

    def say(self, text: str, stream: IO[str] | None = None) -> None:
        """Print `text` on the console (stdout unless `stream`) and append it to the file."""
        out = stream or sys.stdout
        with contextlib.suppress(OSError, ValueError):  # a closed or full console: go on
            print(text, file=out, flush=True)
        self.write(text + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


class ErrorLines:
    """Which lines of one child's output the console shows (module docstring); one per
    child, fed its lines in order."""

    def __init__(self) -> None:
        self._in_error = False

    def shows(self, line: str) -> bool:
        level = _level(line)
        if level is not None:
            self._in_error = level in _ERRORS
            return self._in_error
        if line.startswith("Traceback (most recent call last)"):
            self._in_error = True
        return self._in_error


def _level(line: str) -> str | None:
    """The level of a log record line (text or JSON format), None for any other line."""
    match = _TEXT_RECORD.match(line)
    if match:
        return match["level"]
    if line.startswith("{"):
        try:
            entry = json.loads(line)
        except ValueError:
            return None
        return str(entry.get("level")) if isinstance(entry, dict) else None
    return None


class _ConsoleRecords(logging.Filter):
    """`up`'s own records for the console: its warnings and anyone's errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        return record.levelno >= logging.WARNING and (
            record.name == _UP_LOGGER or record.name.startswith(_UP_LOGGER + "."))


def attach(settings: Settings) -> UpLog:
    """Open the data dir's log file and route this process's log records: all of them to
    the file, those of `_ConsoleRecords` to stderr too (replacing configure_logging's
    handler)."""
    up_log = UpLog(settings.data_dir / LOG_NAME)
    formatter = make_formatter(settings.log_format)
    to_file = logging.StreamHandler(up_log)  # type: ignore[arg-type]
    to_file.setFormatter(formatter)
    to_console = logging.StreamHandler(sys.stderr)
    to_console.setFormatter(formatter)
    to_console.addFilter(_ConsoleRecords())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(to_file)
    root.addHandler(to_console)
    logging.captureWarnings(True)
    return up_log
