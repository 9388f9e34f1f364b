"""MetricBuffer: aggregates data in memory and writes them to the metric store (skeleton)."""

from __future__ import annotations

from eaglenest.db.metrics_repo import Datum
from eaglenest.db.session import Database

DEFAULT_RETENTION_SECONDS = 15 * 86400.0


class MetricBuffer:
    """Thread-safe, bounded, never blocks its caller on the database."""

    def __init__(self, db: Database, max_series: int, flush_seconds: float, *,
                 retention_seconds: float = DEFAULT_RETENTION_SECONDS) -> None:
        self.db = db
        self.max_series = max_series
        self.flush_seconds = flush_seconds
        self.retention_seconds = retention_seconds
        self.dropped = 0

    def add(self, account_id: str, datum: Datum) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError
