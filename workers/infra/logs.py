"""Log output for every EagleNest process: plain text or one JSON object per line.

`EAGLENEST_LOG_FORMAT=json` (Settings.log_format) selects JSON: each record becomes
`{"ts": "<ISO-8601 UTC>", "level", "logger", "message"}` plus `job` / `endpoint` when the
record was logged inside `with log_context(job=name):` (or passed them with `extra=`), and
`exc` with the traceback when it carries one. The worker opens such a context around every
task (workers/infra/celery_app.py, Celery's task_prerun / task_postrun), so every line a job or an
endpoint task logs, Celery's own "succeeded" / "raised" lines included, says which job or
endpoint it was about. Logs go to stderr; stdout is left to what commands print.

In the worker, what is written to sys.stdout / sys.stderr (print(), tqdm bars such as
transformers' "Loading weights") becomes INFO records of `eaglenest.stdout` /
`eaglenest.stderr` (redirect_output), never Celery's WARNING `celery.redirected` lines.

HTTP clients log at WARNING and above only (QUIET_LOGGERS): httpx's INFO line per request
("HTTP Request: POST ... 200 OK") would bury a job's own lines under a benchmark's
hundreds of requests (workers/jobs/loadgen.py).
"""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["text", "json"]

#: the context fields a record may carry (from log_context or `extra=`)
CONTEXT_FIELDS = ("job", "endpoint")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
#: loggers configure_logging holds at WARNING: per-request or per-migration chatter
QUIET_LOGGERS = ("alembic", "httpx", "httpcore")

_context: ContextVar[dict[str, str] | None] = ContextVar("eaglenest_log_context", default=None)


@contextmanager
def log_context(**fields: str | None) -> Iterator[None]:
    """Attach fields (job=..., endpoint=...) to every record logged inside the block, in
    this thread or task (a contextvars context: threads do not share it)."""
    token = enter_context(**fields)
    try:
        yield
    finally:
        _context.reset(token)


def enter_context(**fields: str | None) -> Token[dict[str, str] | None]:
    """log_context without a block (for paired hooks such as Celery's task_prerun and
    task_postrun): returns the token to hand to leave_context."""
    merged = {**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    return _context.set(merged)


def leave_context(token: Token[dict[str, str] | None]) -> None:
    _context.reset(token)


def current_context() -> dict[str, str]:
    return dict(_context.get() or {})


def _fields(record: logging.LogRecord) -> dict[str, str]:
    ctx = _context.get() or {}
    out = {}
    for key in CONTEXT_FIELDS:
        value = getattr(record, key, None) or ctx.get(key)
        if value is not None:
            out[key] = str(value)
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message (+ job, endpoint, exc, stack)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """The plain format, with ` [job=...]` / ` [endpoint=...]` appended inside a context."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        text = super().formatMessage(record)
        fields = _fields(record)
        if fields:
            text += " [" + " ".join(f"{k}={v}" for k, v in fields.items()) + "]"
        return text


def make_formatter(fmt: LogFormat) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else TextFormatter()


def configure_logging(fmt: LogFormat = "text", level: int | str = logging.INFO) -> None:
    """Replace the root logger's handlers with one stderr handler in the chosen format.

    Idempotent: calling it again (the worker does, from Celery's setup_logging signal)
    leaves exactly one handler.
    """
    stream = sys.stderr
    # a redirection of stderr into logging (ours, or Celery's): the real stream, no loops
    if isinstance(stream, LogStream) or type(stream).__name__ == "LoggingProxy":
        stream = sys.__stderr__ or stream
    handler = logging.StreamHandler(stream)
    handler.setFormatter(make_formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)  # warnings.warn(...) as records, in the same format
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


class LogStream(io.TextIOBase):
    """A text stream whose lines become records of `logger` at `level`.

    Each thread has its own buffer (two jobs' output never mixes). A line ended by a newline
    is logged; one ended by a carriage return is a progress bar being redrawn (tqdm): it is
    logged only if `interval` seconds have passed since this thread's last record from this
    stream, so a bar shows as a few lines, its final state (ended by tqdm's newline) always.
    """

    _SPLIT = re.compile(r"(\r\n|\n|\r)")

    def __init__(self, logger: str, level: int = logging.INFO, interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.logger, self.level = logging.getLogger(logger), level
        self.interval, self.clock = interval, clock
        self._local = threading.local()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, data: str) -> int:
        local = self._local
        if getattr(local, "busy", False):  # a handler writing back to us: out, not around
            real = sys.__stderr__
            return real.write(data) if real is not None else len(data)
        parts = self._SPLIT.split(getattr(local, "buffer", "") + data)
        local.buffer = parts[-1]
        for text, end in zip(parts[0:-1:2], parts[1:-1:2], strict=True):
            self._line(text.strip(), redraw=end == "\r")
        return len(data)

    def _line(self, text: str, redraw: bool) -> None:
        local, now = self._local, self.clock()
        if not text or (redraw and now - getattr(local, "last", -1e18) < self.interval):
            return
        local.last, local.busy = now, True
        try:
            self.logger.log(self.level, text)
        finally:
            local.busy = False


def redirect_output(level: int = logging.INFO) -> None:
    """sys.stdout and sys.stderr into logging (`eaglenest.stdout` / `eaglenest.stderr`)."""
    sys.stdout = LogStream("eaglenest.stdout", level)
    sys.stderr = LogStream("eaglenest.stderr", level)
