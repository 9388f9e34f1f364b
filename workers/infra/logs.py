"""Log output for every EagleNest process: plain text or one JSON object per line.

`EAGLENEST_LOG_FORMAT=json` (Settings.log_format) selects JSON: each record becomes
`{"ts": "<ISO-8601 UTC>", "level", "logger", "message"}` plus `job` / `endpoint` when the
record was logged inside `with log_context(job=name):` (or passed them with `extra=`), and
`exc` with the traceback when it carries one. The worker opens such a context around every
task (workers/infra/celery_app.py, Celery's task_prerun / task_postrun), so every line a job or an
endpoint task logs, Celery's own "succeeded" / "raised" lines included, says which job or
endpoint it was about. Logs go to stderr; stdout is left to what commands print.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["text", "json"]

#: the context fields a record may carry (from log_context or `extra=`)
CONTEXT_FIELDS = ("job", "endpoint")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

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
    if type(stream).__name__ == "LoggingProxy":  # Celery's print() redirection: no loops
        stream = sys.__stderr__ or stream
    handler = logging.StreamHandler(stream)
    handler.setFormatter(make_formatter(fmt))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)  # warnings.warn(...) as records, in the same format
    logging.getLogger("alembic").setLevel(logging.WARNING)
