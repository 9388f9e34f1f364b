"""A FailureReason as a caller reads it: the cause in one line, nothing of the host.

Contract, `one_line(reason, account_id)` (db/repository.failure_reason applies it wherever an
endpoint's or a job's FailureReason is set, so every writer gets it; the reason in full
goes to the worker's log there):
- One line: the first line that says something (not a traceback's header or frames), and
  when a Python exception was printed under it (a model server's log, a rank's), that
  exception's message (`first_exception`: the first one, the root of a chain) after it:
  ``the model server (embedded) exited with code 1: unknown architecture NoSuchForCausalLM``.
  Runs of whitespace become one space.
- No host path: an absolute path (``/data/jobs/<account>/<job>/model/config.json``) is cut
  to its last component (``config.json``); URLs and ``s3://`` URIs, the caller's own
  names for its data, are kept.
- No other account: an ARN of another account than `account_id` reads "another account's
  resource", and "account <12 digits>" of another "another account".
- At most `MAX_CHARS` characters (SageMaker's longest FailureReason).
"""

from __future__ import annotations

import re

#: SageMaker's longest FailureReason (its shapes' max length)
MAX_CHARS = 1024
_EXCEPTION = re.compile(r"^(?:\[rank\d+\]: )?(?:[A-Za-z_][\w.]*\.)?"
                        r"([A-Za-z_]\w*(?:Error|Exception))(?:: (.*))?$", re.M)
_NOISE = re.compile(r"^(?:Traceback \(most recent call last\):|File \".*|\^+|~+|During handling "
                    r"of the above exception.*|The above exception was the direct cause.*)$")
#: an absolute POSIX path of two components or more, not inside a URL or an S3 URI
_PATH = re.compile(r"(?<![\w:/.~%-])(?:/[^\s/'\"`:,;()\[\]{}<>]+){2,}/?")
_ARN = re.compile(r"arn:aws[\w-]*:[\w-]+:[\w-]*:(\d{12}):[^\s'\"`,;()\[\]{}<>]+")
_ACCOUNT = re.compile(r"\baccount (\d{12})\b")


def first_exception(text: str) -> str | None:
    """The first Python exception printed in `text` (a log), as ``Name: message`` (the
    module path dropped); None when there is none."""
    found = _EXCEPTION.search(text)
    if found is None:
        return None
    name, message = found.group(1), (found.group(2) or "").strip()
    return f"{name}: {message}" if message else name


def cause(text: str) -> str | None:
    """The first exception printed in `text` (`first_exception`), its message alone when
    that says enough by itself (``KeyError: 'x'`` keeps its name); None when there is none."""
    exception = first_exception(text)
    if exception is None:
        return None
    _, _, message = exception.partition(": ")
    return message if len(message) >= 12 else exception


def _head(reason: str) -> str:
    for line in reason.splitlines():
        line = line.strip()
        if line and not _NOISE.match(line) and not _EXCEPTION.match(line):
            return line
    return ""


def _path(found: re.Match[str]) -> str:
    parts = [p for p in found.group(0).split("/") if p]
    return parts[-1] if parts else ""


def one_line(reason: str, account_id: str | None = None) -> str:
    """`reason` as a FailureReason (module contract)."""
    head, why = _head(reason), cause(reason)
    if why is not None and why not in head:
        head = f"{head.rstrip(': ')}: {why}" if head else why
    text = _PATH.sub(_path, head)
    text = _ARN.sub(lambda m: m.group(0) if m.group(1) == account_id
                    else "another account's resource", text)
    text = _ACCOUNT.sub(lambda m: m.group(0) if m.group(1) == account_id
                        else "another account", text)
    text = " ".join(text.split())
    return text[:MAX_CHARS]
