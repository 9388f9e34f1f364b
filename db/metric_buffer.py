"""MetricBuffer: data added up in memory and written to the metric store (db/metrics_repo.py)
by a thread of its own, so a request that produces a figure never waits on the database.

Contract:
- add() takes the buffer's lock only to add the datum into its (account, series, unit,
  minute) aggregate: a burst of 10,000 invocations of one variant is a few rows a flush.
- Bounded: at most `max_pending` aggregates wait; a datum that would start another is
  dropped and counted in `dropped`, as is a datum record() does not keep (invalid, another
  unit than its series', a new series past `max_series`) and one added after close().
- flush() writes what is pending, one transaction per account (accounts in order). A write
  that fails is logged, never raised, and its data go back into the pending ones (as far as
  the bound allows) for the next flush: a database outage loses nothing it can hold.
- The flusher thread (start()) flushes every `flush_seconds` and sweeps data older than
  `retention_seconds` at most once an hour; close() stops it, joins it and flushes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from eaglenest.db import metrics_repo
from eaglenest.db.metric_histogram import Aggregate
from eaglenest.db.metrics_repo import BatchKey, Datum
from eaglenest.db.session import Database

log = logging.getLogger(__name__)

#: CloudWatch keeps 1-minute data 15 days (Settings.metrics_retention_days)
DEFAULT_RETENTION_SECONDS = 15 * 86400.0
#: aggregates waiting at most (one per account, series, unit and minute)
DEFAULT_MAX_PENDING = 100_000
#: seconds between two sweeps of old data by one buffer
SWEEP_SECONDS = 3600.0
#: seconds between two logged flush failures (the others are logged at debug level)
_LOG_EVERY = 60.0

Pending = dict[str, dict[BatchKey, Aggregate]]


class MetricBuffer:
    """Thread-safe, bounded, never blocks its caller on the database: add() appends under
    a lock (drops and counts when over its bound); a flusher thread owned by the buffer
    writes every `flush_seconds` with metrics_repo; close() flushes and joins."""

    def __init__(self, db: Database, max_series: int, flush_seconds: float, *,
                 retention_seconds: float = DEFAULT_RETENTION_SECONDS,
                 max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.db = db
        self.max_series = max_series
        self.flush_seconds = flush_seconds
        self.retention_seconds = retention_seconds
        self.max_pending = max_pending
        #: data dropped (buffer full, not kept by record(), added after close())
        self.dropped = 0
        self._pending: Pending = {}
        self._size = 0
        self._lock = threading.Lock()
        self._flushing = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._last_sweep: float | None = None
        self._last_error_log = -_LOG_EVERY

    def add(self, account_id: str, datum: Datum) -> None:
        self.add_many(account_id, (datum,))

    def add_many(self, account_id: str, data: Sequence[Datum]) -> None:
        """add() for several data at once: added up outside the lock, merged under it once
        (one invocation's six AWS/SageMaker data are one call)."""
        batch = metrics_repo.aggregate(data)
        kept = sum(agg.sample_count for agg in batch.values())
        with self._lock:
            self.dropped += len(data) - kept
            if self._closed:
                self.dropped += kept
                return
            self._merge(account_id, batch)

    def _merge(self, account_id: str, batch: dict[BatchKey, Aggregate]) -> None:
        """Add `batch` into the pending aggregates (the lock held); what does not fit is
        dropped and counted."""
        pending = self._pending.setdefault(account_id, {})
        for key, agg in batch.items():
            mine = pending.get(key)
            if mine is not None:
                mine.merge(agg)
            elif self._size < self.max_pending:
                pending[key] = agg
                self._size += 1
            else:
                self.dropped += agg.sample_count
        if not pending:
            del self._pending[account_id]

    def pending(self) -> int:
        """Aggregates waiting to be written."""
        with self._lock:
            return self._size

    def flush(self) -> None:
        """Write what is pending now (tests, shutdown); never raises."""
        with self._flushing:
            with self._lock:
                batches, self._pending, self._size = self._pending, {}, 0
            for account_id in sorted(batches):
                self._write(account_id, batches[account_id])

    def _write(self, account_id: str, batch: dict[BatchKey, Aggregate]) -> None:
        total = sum(agg.sample_count for agg in batch.values())
        try:
            with self.db.session() as session:
                kept = metrics_repo.write(session, account_id, batch, self.max_series)
        except Exception:
            self._log_failure(f"metric buffer: writing {total} data of account "
                              f"{account_id!r} failed; kept for the next flush")
            with self._lock:
                self._merge(account_id, batch)
            return
        with self._lock:
            self.dropped += total - kept

    def _log_failure(self, message: str) -> None:
        at = time.monotonic()
        if at - self._last_error_log >= _LOG_EVERY:
            self._last_error_log = at
            log.exception(message)
        else:
            log.debug(message, exc_info=True)

    def sweep(self, now: float | None = None) -> int:
        """Delete data older than the retention; the rows deleted (0 when it failed)."""
        try:
            with self.db.session() as session:
                return metrics_repo.sweep(session, time.time() if now is None else now,
                                          self.retention_seconds)
        except Exception:
            self._log_failure("metric buffer: sweeping old metric data failed")
            return 0

    def start(self) -> None:
        """Start the flusher thread (once)."""
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name="metric-buffer",
                                            daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.flush_seconds):
            self.flush()
            if self._last_sweep is None or time.monotonic() - self._last_sweep >= SWEEP_SECONDS:
                self._last_sweep = time.monotonic()
                self.sweep()

    def close(self) -> None:
        """Stop the flusher, wait for it and write what is pending; add() then drops."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._stop.set()
        if thread is not None:
            thread.join()
        self.flush()
