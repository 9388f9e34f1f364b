"""The metric store (db/metrics_repo.py) on a migrated SQLite file: exact per-minute sums
and counts, CloudWatch's period and dimension rules, percentiles within the documented
error, list filters, the series limit, retention and concurrent writers."""

from __future__ import annotations

import math
import random

import pytest

from eaglenest.db import metrics_repo
from eaglenest.db.metric_histogram import RELATIVE_ERROR
from eaglenest.db.metrics_repo import MAX_DATAPOINTS, Datum, Stat
from eaglenest.db.session import Database
from tests.db.metrics_checks import (
    DIMS,
    NS,
    T0,
    A,
    B,
    check_concurrent_writers,
    check_series_limit_under_race,
)


def inv(at: float, value: float = 1.0, dims: tuple[tuple[str, str], ...] = DIMS,
        name: str = "Invocations", unit: str = "Count", ns: str = NS) -> Datum:
    return Datum(ns, name, dims, value, unit, at)


def record(db: Database, data: list[Datum], account: str = A, max_series: int = 100) -> int:
    with db.session() as s:
        return metrics_repo.record(s, account, data, max_series)


def stats(db: Database, start: float, end: float, period: int = 60, account: str = A,
          name: str = "Invocations", dims: tuple[tuple[str, str], ...] = DIMS,
          unit: str | None = None, percentiles: tuple[float, ...] | list[float] = ()
          ) -> list[Stat]:
    with db.session() as s:
        return metrics_repo.statistics(s, account, NS, name, dims, start, end, period,
                                       unit=unit, percentiles=percentiles)


def test_sums_and_counts_per_minute_and_period(db: Database) -> None:
    # minute 0: 3 data, minute 1: none, minute 2: 2 data (one written later), minute 3: 1
    assert record(db, [inv(T0 + 1, 1), inv(T0 + 30, 0), inv(T0 + 59.9, 5),
                       inv(T0 + 120, 2), inv(T0 + 180, 7)]) == 5
    assert record(db, [inv(T0 + 179, 4)]) == 1
    got = stats(db, T0, T0 + 600)
    assert [(s.start, s.sample_count, s.sum, s.minimum, s.maximum, s.unit) for s in got] == [
        (T0, 3, 6, 0, 5, "Count"), (T0 + 120, 2, 6, 2, 4, "Count"),
        (T0 + 180, 1, 7, 7, 7, "Count")]
    # periods aligned to the epoch, not to the start; start rounded down to its minute
    # (inclusive), end exclusive
    assert [(s.start, s.sample_count, s.sum) for s in stats(db, T0 + 30, T0 + 180, 120)] == [
        (T0, 3, 6), (T0 + 120, 2, 6)]
    assert [s.start for s in stats(db, T0 + 60, T0 + 240, 180)] == [T0, T0 + 180]
    assert [s.sum for s in stats(db, T0 + 60, T0 + 240, 180)] == [6, 7]
    assert stats(db, T0 + 60, T0 + 120) == []
    assert stats(db, T0 + 240, T0 + 3600, 3600) == []


def test_percentiles_within_the_documented_error(db: Database) -> None:
    rng = random.Random(54)
    values = [round(rng.lognormvariate(8, 1.5), 3) for _ in range(3000)]
    record(db, [inv(T0 + i % 300, v, name="ModelLatency", unit="Microseconds")
                for i, v in enumerate(values)])
    asked = [0.0, 10.0, 50.0, 90.0, 99.0, 99.9, 100.0]
    (got,) = stats(db, T0, T0 + 300, 300, name="ModelLatency", percentiles=asked)
    ordered = sorted(values)
    assert got.sample_count == 3000 and got.sum == pytest.approx(sum(values))
    for p in asked:
        exact = ordered[max(1, math.ceil(round(p * len(values) / 100, 6))) - 1]  # nearest rank
        assert abs(got.percentiles[p] - exact) <= RELATIVE_ERROR * exact + 1e-9, p
    assert (got.percentiles[0.0], got.percentiles[100.0]) == (ordered[0], ordered[-1])
    assert RELATIVE_ERROR < 0.02


def test_zero_and_negative_values_have_buckets(db: Database) -> None:
    record(db, [inv(T0, v, name="Delta", unit="None") for v in (-5, -5, 0, 0, 0, 3, 3000)])
    (got,) = stats(db, T0, T0 + 60, name="Delta", percentiles=[25.0, 50.0, 80.0])
    assert got.percentiles[50.0] == 0.0
    assert abs(got.percentiles[25.0] + 5) <= 5 * RELATIVE_ERROR
    assert abs(got.percentiles[80.0] - 3) <= 3 * RELATIVE_ERROR
    assert (got.minimum, got.maximum, got.sum) == (-5, 3000, 2993)


def test_dimensions_match_exactly_and_accounts_are_apart(db: Database) -> None:
    only_endpoint = (("EndpointName", "ep"),)
    more = (*DIMS, ("Zone", "a"))
    record(db, [inv(T0, 1), inv(T0, 10, dims=only_endpoint), inv(T0, 100, dims=more)])
    record(db, [inv(T0, 1000)], account=B)
    assert [s.sum for s in stats(db, T0, T0 + 60)] == [1]
    assert [s.sum for s in stats(db, T0, T0 + 60, dims=only_endpoint)] == [10]
    # the order the pairs are given in does not matter; the set does
    assert [s.sum for s in stats(db, T0, T0 + 60, dims=tuple(reversed(more)))] == [100]
    assert stats(db, T0, T0 + 60, dims=(("VariantName", "v1"),)) == []
    assert [s.sum for s in stats(db, T0, T0 + 60, account=B)] == [1000]
    assert stats(db, T0, T0 + 60, account="222222222222") == []


def test_unit_filter_and_one_unit_per_series(db: Database) -> None:
    assert record(db, [inv(T0, 5, unit="Count"), inv(T0, 7, unit="Seconds")]) == 1
    assert [s.unit for s in stats(db, T0, T0 + 60, unit="Count")] == ["Count"]
    assert stats(db, T0, T0 + 60, unit="Seconds") == []
    assert [s.sum for s in stats(db, T0, T0 + 60)] == [5]


def test_invalid_data_are_not_kept(db: Database) -> None:
    bad = [inv(T0, math.nan), inv(T0, math.inf), inv(T0, 1, name=""), inv(T0, 1, ns="x" * 256),
           inv(T0, 1, dims=(("EndpointName", "e" * 1100),)), inv(-60.0)]
    assert record(db, [*bad, inv(T0, 2)]) == 1
    assert [s.sum for s in stats(db, T0, T0 + 60)] == [2]


def test_requests_are_bounded(db: Database) -> None:
    record(db, [inv(T0)])
    day = 86400.0
    assert len(stats(db, T0, T0 + day)) == 1  # 1440 periods: the most one call answers
    with pytest.raises(ValueError, match="requested up to 1,441 datapoints, which exceeds "
                                         "the limit of 1,440"):
        stats(db, T0, T0 + day + 60)
    assert len(stats(db, T0, T0 + 7 * day, 420)) == 1
    with pytest.raises(ValueError, match="multiple of 60"):
        stats(db, T0, T0 + 600, 90)
    with pytest.raises(ValueError, match="StartTime must be less than"):
        stats(db, T0, T0)
    with pytest.raises(ValueError, match="between 0 and 100"):
        stats(db, T0, T0 + 60, percentiles=[100.5])
    assert MAX_DATAPOINTS == 1440


def test_list_metrics_filters(db: Database) -> None:
    other = (("EndpointName", "ep"), ("VariantName", "v2"))
    record(db, [inv(T0), inv(T0 + 600, dims=other), inv(T0, name="ModelLatency"),
                inv(T0, ns="EagleNest/Endpoints", name="SpeculationK")])
    record(db, [inv(T0, dims=(("EndpointName", "theirs"),))], account=B)

    def names(**kw: object) -> list[tuple[str, str, tuple[tuple[str, str], ...]]]:
        args = {"namespace": None, "name": None, "dimension_filters": [], "since": None, **kw}
        with db.session() as s:
            return metrics_repo.list_metrics(s, A, **args)  # type: ignore[arg-type]

    assert names() == [("AWS/SageMaker", "Invocations", DIMS),
                       ("AWS/SageMaker", "Invocations", other),
                       ("AWS/SageMaker", "ModelLatency", DIMS),
                       ("EagleNest/Endpoints", "SpeculationK", DIMS)]
    assert [n[1] for n in names(namespace=NS, name="ModelLatency")] == ["ModelLatency"]
    assert names(dimension_filters=[("VariantName", "v2")]) == [
        ("AWS/SageMaker", "Invocations", other)]
    assert len(names(dimension_filters=[("VariantName", None), ("EndpointName", "ep")])) == 4
    assert names(dimension_filters=[("Zone", None)]) == []
    assert names(since=T0 + 300) == [("AWS/SageMaker", "Invocations", other)]


def test_series_limit_per_account(db: Database) -> None:
    def series(i: int) -> tuple[tuple[str, str], ...]:
        return (("EndpointName", f"e{i}"),)

    assert record(db, [inv(T0, dims=series(i)) for i in range(3)], max_series=2) == 2
    # a known series is still written at the limit; a new one is not
    assert record(db, [inv(T0, dims=series(0)), inv(T0, dims=series(9))], max_series=2) == 1
    assert record(db, [inv(T0, dims=series(5))], account=B, max_series=2) == 1
    with db.session() as s:
        assert len(metrics_repo.list_metrics(s, A, None, None, [], None)) == 2


def test_latest_is_each_series_last_minute_average(db: Database) -> None:
    ns = "EagleNest/Hosts"
    host = (("Host", "h1"),)
    record(db, [inv(T0, 10, dims=host, ns=ns, name="GPUsHeld"),
                inv(T0 + 61, 2, dims=host, ns=ns, name="GPUsHeld"),
                inv(T0 + 62, 4, dims=host, ns=ns, name="GPUsHeld")], account="")
    record(db, [inv(T0 + 5, 50, ns=ns, name="GPUsHeld")])
    with db.session() as s:
        got = metrics_repo.latest(s, ns, T0)
        assert metrics_repo.latest(s, ns, T0 + 63) == []
    assert got == [("", Datum(ns, "GPUsHeld", host, 3.0, "Count", T0 + 60)),
                   (A, Datum(ns, "GPUsHeld", DIMS, 50.0, "Count", T0))]


def test_sweep_deletes_old_minutes_and_empty_series(db: Database) -> None:
    day = 86400.0
    record(db, [inv(T0), inv(T0 + 10 * day, name="ModelLatency"), inv(T0 + 10 * day)])
    with db.session() as s:
        assert metrics_repo.sweep(s, T0 + 10 * day, 15 * day) == 0
        # the minute of T0 ended before the cutoff: it goes, its series keeps newer data
        assert metrics_repo.sweep(s, T0 + 15 * day + 60, 15 * day) == 1
    assert stats(db, T0, T0 + 60) == []
    assert len(stats(db, T0, T0 + 11 * day, 3600)) == 1
    with db.session() as s:
        assert metrics_repo.sweep(s, T0 + 26 * day, 15 * day) == 4  # 2 minutes, 2 series
        assert metrics_repo.list_metrics(s, A, None, None, [], None) == []


def test_concurrent_writers(db: Database) -> None:
    check_concurrent_writers(db)


def test_series_limit_under_concurrent_writers(db: Database) -> None:
    check_series_limit_under_race(db)
