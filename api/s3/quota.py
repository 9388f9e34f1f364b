"""The stored-bytes quota (EAGLENEST_MAX_STORED_BYTES) on the S3 API's writes.

What an account uses, here: the objects of the buckets it owns (foundation/store/disk_usage.py
account_bytes), its multipart uploads in progress (staged_bytes), and the bodies of its
requests still arriving in this API process (reserved in `LEDGER` as they arrive).

Contract (`Meter`, one per write):
- `start(declared)`: QuotaExceeded before the body is read when its declared size (Content-
  Length, x-amz-decoded-content-length, a copy's source) does not fit beside what is used
  and what the account's other bodies in flight have reserved;
- `add(n)` as each piece arrives: a body without a declared size (chunked, aws-chunked with
  no decoded length), or one longer than declared, is reserved as it comes and refused
  (QuotaExceeded) as soon as it passes the quota, not after it all came;
- `commit(size, action)` makes the write happen (`action`: the object renamed into place,
  the part moved into its upload) holding the account's locks, after measuring the disk
  again: writes of one account racing each other never pass the quota together, and parts,
  Complete, Abort and the sweeper (api/s3/uploads.py) never interleave. A request waits
  for its account's turn on the event loop (an asyncio lock), never in a worker thread, so
  one account's pile of writes cannot take the threads every other request needs; the
  threading lock, taken next in the worker thread, is only ever held briefly;
- what the write replaces (the object's or the part's former bytes, `replaced`) does not
  count; the reservation is released at commit or when the meter closes (`with`).
Writes made elsewhere (a worker's job outputs) are measured, not reserved
(foundation/store/disk_usage.py check_stored).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from eaglenest.api.s3.request import S3Request
from eaglenest.api.s3.store_access import run
from eaglenest.foundation.store.disk_usage import (
    StoredBytesExceeded,
    account_bytes,
    exceeded_message,
    staged_bytes,
)

T = TypeVar("T")


class Ledger:
    """Per API process: the bytes each account's bodies in flight reserved, and a lock per
    account for its commits."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._reserved: dict[str, int] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._turns: dict[tuple[int, str], asyncio.Lock] = {}

    def lock(self, account_id: str) -> threading.Lock:
        """The account's lock for a change to its bytes (held in a worker thread)."""
        with self._guard:
            return self._locks.setdefault(account_id, threading.Lock())

    def turn(self, account_id: str) -> asyncio.Lock:
        """The account's queue for commits, on the running event loop (an asyncio lock
        belongs to one loop: a process running several, tests, gets one per loop)."""
        key = (id(asyncio.get_running_loop()), account_id)
        with self._guard:
            return self._turns.setdefault(key, asyncio.Lock())

    def reserve(self, account_id: str, delta: int) -> int:
        """Add `delta` bytes (negative: release) to the account's reservation; the total."""
        with self._guard:
            total = self._reserved.get(account_id, 0) + delta
            if total:
                self._reserved[account_id] = total
            else:
                self._reserved.pop(account_id, None)
            return total

    def reserved(self, account_id: str) -> int:
        with self._guard:
            return self._reserved.get(account_id, 0)


LEDGER = Ledger()


def used(req: S3Request) -> int:
    """The caller's account's bytes on disk: its buckets and its uploads in progress."""
    account = req.store.account_id
    return account_bytes(req.store.store, account) + staged_bytes(req.settings.data_dir,
                                                                  account)


def _none() -> int:
    return 0


class Meter:
    """One write's bytes against its account's quota (module docstring)."""

    def __init__(self, req: S3Request, replaced: Callable[[], int] = _none) -> None:
        self.req, self.replaced = req, replaced
        self.account, self.limit = req.store.account_id, req.settings.max_stored_bytes
        self.base = 0  # used, less what is replaced, when the write started
        self.held = 0  # reserved in LEDGER
        self.received = 0

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

    def _measure(self) -> int:
        return used(self.req) - self.replaced()

    async def start(self, declared: int | None) -> None:
        if not self.limit:
            return
        self.base = await run(self._measure)
        self._grow(declared or 0)

    def add(self, n: int) -> None:
        self.received += n
        if self.limit and self.received > self.held:
            self._grow(self.received)

    def _grow(self, size: int) -> None:
        total = LEDGER.reserve(self.account, size - self.held)
        self.held = size
        if self.base + total > self.limit:
            raise StoredBytesExceeded(exceeded_message(
                self.limit, max(0, self.base + total - size), size))

    def release(self) -> None:
        if self.held:
            LEDGER.reserve(self.account, -self.held)
            self.held = 0

    async def commit(self, size: int, action: Callable[[], T]) -> T:
        """`action()` under the account's locks if `size` bytes still fit (measured and
        done in a worker thread)."""
        async with LEDGER.turn(self.account):
            return await run(self._commit, size, action)

    def _commit(self, size: int, action: Callable[[], T]) -> T:
        with LEDGER.lock(self.account):
            if self.limit:
                others = LEDGER.reserved(self.account) - self.held
                now = self._measure() + others
                if now + size > self.limit:
                    raise StoredBytesExceeded(exceeded_message(self.limit, max(0, now), size))
            try:
                return action()
            finally:
                self.release()
