"""Per-account disk quotas of Data Capture (a CaptureWriter owns one DiskQuota and calls
its `admit` for every record).

Contract:
- `DiskQuota(store, spool_dir, limits).admit(account_id, nbytes)` is True when the record
  may be spooled, False when it would take the account past either quota; then the record
  is not captured and the request is served as always (capture never fails an invocation,
  as on SageMaker):
  - EAGLENEST_MAX_CAPTURE_SPOOL_BYTES: the account's records spooled on this API host and
    not yet in the store (every API process's files under the writer's spool directory:
    the ones being filled and the rolled ones waiting for an upload that failed);
  - EAGLENEST_MAX_STORED_BYTES: the account's bytes in the store (foundation/store/disk_usage.py
    account_bytes: its buckets, uploaded captures included) plus its spool.
  Capturing resumes by itself once uploads (the spool) or deletions (the store) free room.
- Cheap on the request path: the spool directory is rescanned at most every
  `SCAN_SECONDS` (records admitted since count on top); the store is measured in a thread of
  its own at most every `REFRESH_SECONDS` per account, never in the caller's (until the
  first measurement the store counts 0).
- A refusal is logged at most once a minute per account, in a ResourceLimitExceeded's
  words, with the number of records not captured since the last such line.
- The limits are given (`Limits.of(settings)`: the API's Settings); nothing is module state.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglenest.foundation.settings import Settings
from eaglenest.foundation.store.disk_usage import account_bytes

log = logging.getLogger("eaglenest.capture")
SCAN_SECONDS = 1.0
REFRESH_SECONDS = 60.0
WARN_SECONDS = 60.0


@dataclass(frozen=True)
class Limits:
    """Per account, bytes (0: no limit)."""

    spool: int
    stored: int

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(settings.max_capture_spool_bytes, settings.max_stored_bytes)


class DiskQuota:
    """One spool directory's accounting (one per CaptureWriter)."""

    def __init__(self, store: Any, spool_dir: Path, limits: Limits) -> None:
        self.store, self.spool_dir, self.limits = store, spool_dir, limits
        self._lock = threading.Lock()
        self._spool: dict[str, int] = {}
        self._scanned = -math.inf
        self._meta: dict[Path, str] = {}  # spool meta file -> its account (never changes)
        self._stored: dict[str, tuple[float, int]] = {}  # account -> (measured at, bytes)
        self._measuring: set[str] = set()
        self._dropped: dict[str, int] = {}
        self._warned: dict[str, float] = {}

    def admit(self, account: str, nbytes: int) -> bool:
        """Whether `nbytes` more may be spooled for `account` (module docstring)."""
        limits, now = self.limits, time.monotonic()
        with self._lock:
            if now - self._scanned >= SCAN_SECONDS:
                self._spool, self._scanned = self._scan(), now
            spooled = self._spool.get(account, 0)
            refusal = self._refusal(account, spooled, nbytes, limits, now)
            if refusal is None:
                self._spool[account] = spooled + nbytes
                return True
            self._dropped[account] = self._dropped.get(account, 0) + 1
            if now - self._warned.get(account, -math.inf) < WARN_SECONDS:
                return False
            self._warned[account] = now
            dropped = self._dropped.pop(account)
        log.warning("Data Capture of account %s stopped: %s %d record(s) not captured since "
                    "the last warning; capturing resumes once room is freed.", account,
                    refusal, dropped)
        return False

    def _refusal(self, account: str, spooled: int, nbytes: int, limits: Limits,
                 now: float) -> str | None:
        """Why `nbytes` more may not be spooled, in a ResourceLimitExceeded's words."""
        if limits.spool and spooled + nbytes > limits.spool:
            return _message("Data Capture spool bytes", limits.spool, spooled, nbytes,
                            "EAGLENEST_MAX_CAPTURE_SPOOL_BYTES")
        if limits.stored:
            stored = self._stored_bytes(account, now) + spooled
            if stored + nbytes > limits.stored:
                return _message("bytes stored", limits.stored, stored, nbytes,
                                "EAGLENEST_MAX_STORED_BYTES")
        return None

    def _scan(self) -> dict[str, int]:
        """Bytes of each account's spool files, every API process's (under the lock)."""
        usage: dict[str, int] = {}
        seen: dict[Path, str] = {}
        for meta in self.spool_dir.glob("*/*.json"):
            account = self._meta.get(meta)
            try:
                if account is None:
                    account = str(json.loads(meta.read_text())["account"])
                size = meta.with_suffix(".jsonl").stat().st_size
            except (OSError, ValueError, KeyError, TypeError):
                continue  # uploaded meanwhile, being written, or from before accounts
            seen[meta] = account
            usage[account] = usage.get(account, 0) + size
        self._meta = seen
        return usage

    def _stored_bytes(self, account: str, now: float) -> int:
        """The last measurement of the account's store bytes; a new one is started in the
        background when it is older than REFRESH_SECONDS (under the lock)."""
        measured, value = self._stored.get(account, (-math.inf, 0))
        if now - measured >= REFRESH_SECONDS and account not in self._measuring:
            self._measuring.add(account)
            threading.Thread(target=self._measure, args=(account, value), daemon=True,
                             name="capture-quota").start()
        return value

    def _measure(self, account: str, previous: int) -> None:
        try:
            value = account_bytes(self.store, account)
        except Exception as exc:  # the store is down: keep the last figure a while
            log.warning("Data Capture quota: could not measure account %s's bytes in the "
                        "store: %s", account, exc)
            value = previous
        with self._lock:
            self._stored[account] = (time.monotonic(), value)
            self._measuring.discard(account)


def _message(quota: str, limit: int, used: int, delta: int, setting: str) -> str:
    return (f"ResourceLimitExceeded: The account-level service limit '{quota}' is {limit} "
            f"Bytes, with current utilization of {used} Bytes and a request delta of {delta} "
            f"Bytes. Ask the operator to raise {setting}.")
