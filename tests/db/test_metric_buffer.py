"""MetricBuffer (db/metric_buffer.py) on a migrated SQLite file: aggregation in memory, its
bound, the series limit counted, two buffers writing one series at once, close(), a
database that fails, and the flusher's retention sweep."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import func, select

from eaglenest.db import metrics_repo
from eaglenest.db.metric_buffer import MetricBuffer
from eaglenest.db.metrics_repo import Datum, Stat
from eaglenest.db.migrate import upgrade_head
from eaglenest.db.session import Database
from eaglenest.db.tables import MetricMinuteRow
from tests.db.metrics_checks import DIMS, NS, T0, A, B, in_threads


def inv(at: float, value: float = 1.0, endpoint: str = "ep") -> Datum:
    dims = (("EndpointName", endpoint), ("VariantName", "v1"))
    return Datum(NS, "Invocations", dims, value, "Count", at)


def stats(db: Database, account: str = A, period: int = 60) -> list[Stat]:
    with db.session() as s:
        return metrics_repo.statistics(s, account, NS, "Invocations", DIMS, T0, T0 + 3600,
                                       period)


def minute_rows(db: Database) -> int:
    with db.session() as s:
        return s.scalar(select(func.count()).select_from(MetricMinuteRow)) or 0


def until(check: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.02)


def test_a_burst_is_added_up_before_it_is_written(db: Database) -> None:
    buf = MetricBuffer(db, max_series=10, flush_seconds=60)
    data = [inv(T0 + 60 * (i % 2) + i % 60, value=i % 3) for i in range(10_000)]
    for d in data:
        buf.add(A, d)
    buf.add(B, inv(T0))
    assert buf.pending() == 3  # two minutes of A's series, one of B's
    buf.flush()
    assert (buf.pending(), buf.dropped, minute_rows(db)) == (0, 0, 3)
    assert [(s.start, s.sample_count, s.sum) for s in stats(db)] == [
        (T0 + 60 * m, 5000, sum(d.value for d in data[m::2])) for m in (0, 1)]
    assert [s.sample_count for s in stats(db, account=B)] == [1]


def test_bounded_and_drops_counted(db: Database) -> None:
    buf = MetricBuffer(db, max_series=2, flush_seconds=60, max_pending=3)
    for endpoint in ("e1", "e2", "e3", "e4"):
        buf.add(A, inv(T0, endpoint=endpoint))
    buf.add(A, inv(T0 + 1, endpoint="e1"))  # into a pending aggregate: kept
    buf.add(A, inv(T0, value=float("nan")))
    assert (buf.pending(), buf.dropped) == (3, 2)  # e4 (full), the NaN
    buf.flush()
    assert buf.dropped == 3  # and e3: a new series past max_series
    with db.session() as s:
        assert len(metrics_repo.list_metrics(s, A, None, None, [], None)) == 2


def test_two_buffers_write_one_series_minute_at_once(db: Database) -> None:
    buffers = [MetricBuffer(db, max_series=10, flush_seconds=0.005) for _ in range(2)]
    for buf in buffers:
        buf.start()

    def producer(buf: MetricBuffer, value: float) -> Callable[[], None]:
        def go() -> None:
            for i in range(3000):
                buf.add(A, inv(T0 + i % 60, value))
                if i % 500 == 0:
                    time.sleep(0.01)  # let the flusher write between bursts
        return go

    in_threads(producer(buffers[0], 1.0), producer(buffers[1], 2.0))
    for buf in buffers:
        buf.close()
    assert [b.dropped for b in buffers] == [0, 0]
    (got,) = stats(db)
    assert (got.sample_count, got.sum, got.minimum, got.maximum) == (6000, 9000, 1, 2)


def test_close_joins_the_flusher_and_writes_what_is_pending(db: Database) -> None:
    buf = MetricBuffer(db, max_series=10, flush_seconds=3600)
    buf.start()
    buf.add(A, inv(T0, 4))
    thread = buf._thread
    assert thread is not None and thread.is_alive()
    buf.close()
    assert not thread.is_alive()
    assert [s.sum for s in stats(db)] == [4]
    buf.add(A, inv(T0, 4))
    buf.close()
    assert (buf.dropped, [s.sum for s in stats(db)]) == (1, [4])


def test_a_failing_database_is_logged_and_the_data_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = f"sqlite:///{tmp_path / 'late.db'}"
    late = Database(url)  # no tables yet: every write fails
    try:
        buf = MetricBuffer(late, max_series=10, flush_seconds=60)
        buf.add(A, inv(T0, 3))
        buf.flush()  # does not raise
        assert (buf.pending(), buf.dropped) == (1, 0)
        assert "writing 1 data of account '000000000000' failed" in caplog.text
        upgrade_head(url)
        buf.add(A, inv(T0, 5))
        buf.flush()
        assert (buf.pending(), [(s.sample_count, s.sum) for s in stats(late)]) == (0, [(2, 8)])
    finally:
        late.dispose()


def test_the_flusher_sweeps_old_data(db: Database) -> None:
    now = time.time()
    with db.session() as s:
        metrics_repo.record(s, A, [inv(now - 7200), inv(now)], 10)
    assert minute_rows(db) == 2
    buf = MetricBuffer(db, max_series=10, flush_seconds=0.01, retention_seconds=3600)
    buf.start()
    try:
        until(lambda: minute_rows(db) == 1)
    finally:
        buf.close()


def test_add_many_counts_what_it_drops_and_merges_the_rest(db: Database) -> None:
    """One call for an invocation's data: valid data are added up per series and minute,
    an invalid one (not finite) is dropped and counted; after close() all are dropped."""
    buffer = MetricBuffer(db, 10, 60.0)
    data = [Datum(NS, "Invocations", DIMS, 1.0, "Count", T0),
            Datum(NS, "Invocations", DIMS, 1.0, "Count", T0 + 1),
            Datum(NS, "ModelLatency", DIMS, float("nan"), "Microseconds", T0)]
    buffer.add_many(A, data)
    assert (buffer.pending(), buffer.dropped) == (1, 1)
    buffer.close()
    assert [(st.sample_count, st.sum) for st in stats(db)] == [(2, 2.0)]
    buffer.add_many(A, data[:2])
    assert buffer.dropped == 3
