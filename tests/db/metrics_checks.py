"""Checks of the metric store under concurrent writers on a database, shared by the SQLite
tests (tests/db/test_metrics_repo.py) and the PostgreSQL ones
(tests/integration/test_metrics_postgres.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from eaglenest.db import metrics_repo
from eaglenest.db.metrics_repo import Datum
from eaglenest.db.session import Database

A, B = "000000000000", "111111111111"
NS = "AWS/SageMaker"
DIMS = (("EndpointName", "ep"), ("VariantName", "v1"))
#: a minute boundary (epoch seconds), far from now so nothing else writes there
T0 = 1_800_000_000.0


def in_threads(*work: Callable[[], None]) -> None:
    """Run each callable in its own thread, started together; re-raise the first error."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(work))

    def run(fn: Callable[[], None]) -> None:
        try:
            start.wait()
            fn()
        except BaseException as exc:  # reported to the test below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a writer hung (deadlock?)"
    if errors:
        raise errors[0]


def check_concurrent_writers(db: Database, rounds: int = 30) -> None:
    """Two writers add into the same three series-minutes (in opposite orders) at once:
    every count, sum, extreme and histogram count is exact afterwards."""
    def writer(values: list[float], order: list[int]) -> Callable[[], None]:
        def go() -> None:
            for _ in range(rounds):
                data = [Datum(NS, "ModelLatency", DIMS, v, "Microseconds", T0 + 60 * m)
                        for m in order for v in values]
                with db.session() as s:
                    assert metrics_repo.record(s, A, data, 100) == len(data)
        return go

    in_threads(writer([1.0, 2.0], [0, 1, 2]), writer([10.0, 1000.0, 0.0], [2, 1, 0]))
    with db.session() as s:
        stats = metrics_repo.statistics(s, A, NS, "ModelLatency", DIMS, T0, T0 + 180, 60,
                                        percentiles=[50.0])
    assert [st.start for st in stats] == [T0, T0 + 60, T0 + 120]
    for st in stats:
        assert st.sample_count == 5 * rounds
        assert st.sum == 1013.0 * rounds
        assert (st.minimum, st.maximum) == (0.0, 1000.0)
        # 5 values a round: 0, 1, 2, 10, 1000 -> the median is 2 (to the 2% of a bucket)
        assert abs(st.percentiles[50.0] - 2.0) <= 0.02 * 2.0


def check_series_limit_under_race(db: Database, limit: int = 5) -> None:
    """Two writers create series of one account at once: the account ends with exactly
    `limit` series, and each kept datum is in one of them."""
    kept: list[int] = []

    def writer(prefix: str) -> Callable[[], None]:
        def go() -> None:
            for i in range(limit):
                datum = Datum(NS, "Invocations", (("EndpointName", f"{prefix}{i}"),), 1.0,
                              "Count", T0)
                with db.session() as s:
                    kept.append(metrics_repo.record(s, B, [datum], limit))
        return go

    in_threads(writer("x"), writer("y"))
    assert sum(kept) == limit
    with db.session() as s:
        names = metrics_repo.list_metrics(s, B, NS, "Invocations", [], None)
    assert len(names) == limit
