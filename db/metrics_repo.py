"""The metric store: per account, per series, per minute aggregates (tables metric_series
and metric_minutes, migration 0007), read with CloudWatch's semantics.

Contract:
- A series is (account_id, namespace, name, dimensions); its dimensions are kept as one
  canonical string (the pairs sorted by name, compact JSON), and a read names them exactly.
  Account "" holds service-wide series (hosts), which no account's read returns.
- A series has one unit, its first datum's; a datum of another unit is dropped. So is a
  datum that is not finite, has an empty or too long namespace / name (255 bytes),
  dimensions (1024 bytes) or unit (32 bytes), or starts a new series of an account that
  already has `max_series`. record() returns how many it kept.
- record() is correct under concurrent writers (threads, processes, hosts): sample count,
  sum, minimum and maximum are added by one upsert per minute row; the histogram is then
  read and rewritten while the upsert's row lock is held (on PostgreSQL the row lock, on
  SQLite the database's write lock, which record() takes before its first read). Rows are
  locked in (series id, minute) order, so two writers never deadlock. New series of an
  account are created one writer at a time (PostgreSQL: an advisory lock per account), so
  the series limit holds exactly.
- Reads are bounded: statistics() answers at most MAX_DATAPOINTS periods per call, and a
  series holds at most the retention's minutes (sweep()).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import JSON, Table, bindparam, case, exists, false, func, select, text, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from eaglenest.db.metric_histogram import Aggregate, merged, percentile
from eaglenest.db.tables import MetricMinuteRow, MetricSeriesRow

Dimensions = tuple[tuple[str, str], ...]
#: (namespace, name, canonical dimensions): a series of one account
Ident = tuple[str, str, str]
#: the most periods one statistics() call answers (CloudWatch's limit per request)
MAX_DATAPOINTS = 1440
#: rows per statement (SQLite's bound parameters stay far below its limit)
_CHUNK = 300
_SERIES = cast(Table, MetricSeriesRow.__table__)
_MINUTES = cast(Table, MetricMinuteRow.__table__)


@dataclass(frozen=True)
class Datum:
    """One value of one series at one time."""

    namespace: str
    name: str
    #: (name, value) pairs sorted by name
    dimensions: Dimensions
    value: float
    #: a CloudWatch StandardUnit: "Count", "Microseconds", "Percent", "None", ...
    unit: str
    #: epoch seconds
    at: float


@dataclass(frozen=True)
class Stat:
    """One period's statistics of one series."""

    #: the period's start, epoch seconds (a multiple of the period)
    start: float
    sample_count: float
    sum: float
    minimum: float
    maximum: float
    unit: str
    #: percentile (as asked, e.g. 99.0) -> value; only the asked ones
    percentiles: dict[float, float] = field(default_factory=dict)


def dimensions_key(dimensions: Iterable[tuple[str, str]]) -> str:
    """The canonical string of a series' dimensions (sorted by name, compact JSON)."""
    if isinstance(dimensions, tuple):  # a Datum's: hashable, and repeated on every call
        return _tuple_key(dimensions)
    return _key_of(dimensions)


def _key_of(dimensions: Iterable[tuple[str, str]]) -> str:
    pairs = sorted((str(k), str(v)) for k, v in dimensions)
    return json.dumps([list(p) for p in pairs], separators=(",", ":"), ensure_ascii=False)


@functools.lru_cache(maxsize=4096)
def _tuple_key(dimensions: tuple[tuple[str, str], ...]) -> str:
    return _key_of(dimensions)


def _dimensions(key: str) -> Dimensions:
    return tuple((str(k), str(v)) for k, v in json.loads(key))


def _fits(text_: str, limit: int) -> bool:
    return 0 < len(text_.encode()) <= limit


def _valid(d: Datum, dims: str) -> bool:
    return (math.isfinite(d.value) and math.isfinite(d.at) and d.at >= 0
            and _fits(d.namespace, 255) and _fits(d.name, 255) and _fits(d.unit, 32)
            and len(dims.encode()) <= 1024)


#: a minute of one series in one unit: ((namespace, name, dimensions), unit, minute)
BatchKey = tuple[Ident, str, int]


def aggregate(data: Iterable[Datum], into: dict[BatchKey, Aggregate] | None = None
              ) -> dict[BatchKey, Aggregate]:
    """Data added up per series, unit and minute (`into`, or a new dict); invalid data
    (see the module's contract) are left out."""
    out = {} if into is None else into
    for d in data:
        dims = dimensions_key(d.dimensions)
        if not _valid(d, dims):
            continue
        key = ((d.namespace, d.name, dims), d.unit, int(d.at // 60))
        agg = out.get(key)
        if agg is None:
            agg = out[key] = Aggregate()
        agg.add(d.value, d.at)
    return out


def record(session: Session, account_id: str, data: Iterable[Datum], max_series: int) -> int:
    """Add each datum into its series' minute; returns how many were kept."""
    return write(session, account_id, aggregate(data), max_series)


def write(session: Session, account_id: str, batch: Mapping[BatchKey, Aggregate],
          max_series: int) -> int:
    """record() of data already aggregated (MetricBuffer); returns the data kept."""
    if not batch:
        return 0
    if _dialect(session) == "sqlite":
        # take the database's write lock before the first read (see the contract)
        session.execute(_SERIES.update().where(false()).values(last_time=0))
    units: dict[Ident, str] = {}
    for ident, unit, _ in sorted(batch):
        units.setdefault(ident, unit)
    ids = _series_ids(session, account_id, units, max_series)
    kept = {(ids[ident], minute): agg for (ident, unit, minute), agg in batch.items()
            if ident in ids and ids[ident][1] == unit}
    if not kept:
        return 0
    last: dict[int, float] = {}
    for (series, _), agg in kept.items():
        last[series[0]] = max(last.get(series[0], 0.0), agg.last_time)
    t: Any = bindparam("t")
    session.execute(
        _SERIES.update().where(_SERIES.c.id == bindparam("sid"))
        .values(last_time=case((_SERIES.c.last_time < t, t), else_=_SERIES.c.last_time)),
        [{"sid": sid, "t": at} for sid, at in sorted(last.items())])
    _add_minutes(session, {(s[0], m): agg for (s, m), agg in kept.items()})
    return sum(agg.sample_count for agg in kept.values())


def _dialect(session: Session) -> str:
    return session.get_bind().dialect.name


def _existing(session: Session, account_id: str, idents: Iterable[Ident]
              ) -> dict[Ident, tuple[int, str]]:
    """ident -> (series id, unit) of those of `idents` the account has."""
    out: dict[Ident, tuple[int, str]] = {}
    wanted = list(idents)
    s = _SERIES.c
    for i in range(0, len(wanted), _CHUNK):
        rows = session.execute(
            select(s.id, s.namespace, s.name, s.dimensions, s.unit).where(
                s.account_id == account_id,
                tuple_(s.namespace, s.name, s.dimensions).in_(wanted[i:i + _CHUNK])))
        for r in rows:
            out[(r.namespace, r.name, r.dimensions)] = (r.id, r.unit)
    return out


def _series_ids(session: Session, account_id: str, units: Mapping[Ident, str],
                max_series: int) -> dict[Ident, tuple[int, str]]:
    """ident -> (id, unit) of the batch's series, creating new ones while the account has
    room; a new series beyond `max_series` is left out."""
    found = _existing(session, account_id, units)
    new = [ident for ident in units if ident not in found]
    if not new:
        return found
    if _dialect(session) == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(hashtext(:k))"),
                        {"k": f"eaglenest.metric_series:{account_id}"})
    found.update(_existing(session, account_id, new))
    count = session.scalar(select(func.count()).select_from(_SERIES)
                           .where(_SERIES.c.account_id == account_id)) or 0
    create = sorted(ident for ident in new if ident not in found)[:max(0, max_series - count)]
    insert = pg_insert if _dialect(session) == "postgresql" else sqlite_insert
    for i in range(0, len(create), _CHUNK):
        session.execute(insert(_SERIES).values([
            {"account_id": account_id, "namespace": ns, "name": name, "dimensions": dims,
             "unit": units[(ns, name, dims)], "last_time": 0.0}
            for ns, name, dims in create[i:i + _CHUNK]]).on_conflict_do_nothing())
    found.update(_existing(session, account_id, create))
    return found


def _add_minutes(session: Session, rows: Mapping[tuple[int, int], Aggregate]) -> None:
    """Add each aggregate into its (series id, minute) row, in key order."""
    keys = sorted(rows)
    insert = pg_insert if _dialect(session) == "postgresql" else sqlite_insert
    m = _MINUTES.c
    for i in range(0, len(keys), _CHUNK):
        stmt = insert(_MINUTES).values([
            {"series_id": sid, "minute": minute, "sample_count": rows[sid, minute].sample_count,
             "sum": rows[sid, minute].sum, "minimum": rows[sid, minute].minimum,
             "maximum": rows[sid, minute].maximum, "histogram": {}}
            for sid, minute in keys[i:i + _CHUNK]])
        new = stmt.excluded
        session.execute(stmt.on_conflict_do_update(
            index_elements=[m.series_id, m.minute],
            set_={"sample_count": m.sample_count + new.sample_count, "sum": m.sum + new.sum,
                  "minimum": case((new.minimum < m.minimum, new.minimum), else_=m.minimum),
                  "maximum": case((new.maximum > m.maximum, new.maximum), else_=m.maximum)}))
    updates: list[dict[str, Any]] = []
    for i in range(0, len(keys), _CHUNK):
        stored = session.execute(
            select(m.series_id, m.minute, m.histogram)
            .where(tuple_(m.series_id, m.minute).in_(keys[i:i + _CHUNK]))
            .order_by(m.series_id, m.minute).with_for_update())
        updates += [{"sid": r.series_id, "m": r.minute,
                     "h": merged(r.histogram or {}, rows[r.series_id, r.minute].histogram)}
                    for r in stored]
    session.execute(
        _MINUTES.update().where(m.series_id == bindparam("sid"), m.minute == bindparam("m"))
        .values(histogram=bindparam("h", type_=JSON)), updates)


def _check_request(start: float, end: float, period: int, percentiles: Sequence[float]
                   ) -> None:
    if period <= 0 or period % 60:
        raise ValueError("The parameter Period must be a multiple of 60.")
    if not start < end:
        raise ValueError("The parameter StartTime must be less than the parameter EndTime.")
    # counted as CloudWatch does, from the start rounded down to its minute (the periods
    # answered are aligned to the epoch, so there may be one more with data)
    wanted = math.ceil((end - math.floor(start / 60) * 60) / period)
    if wanted > MAX_DATAPOINTS:
        raise ValueError(
            f"You have requested up to {wanted:,} datapoints, which exceeds the limit of "
            f"{MAX_DATAPOINTS:,}. You may reduce the datapoints requested by increasing "
            "Period, or decreasing the time range.")
    for p in percentiles:
        if not 0 <= p <= 100:
            raise ValueError(f"The percentile {p} is not between 0 and 100.")


def statistics(session: Session, account_id: str, namespace: str, name: str,
               dimensions: Dimensions, start: float, end: float, period: int,
               unit: str | None = None, percentiles: Sequence[float] = ()) -> list[Stat]:
    """The series' statistics per `period` seconds (a multiple of 60; periods aligned to
    the epoch), over the minutes from `start` (rounded down to its minute) up to `end`
    (exclusive); only periods with data, ascending. The dimensions match the series'
    exactly; with `unit`, data of another unit are not returned. ValueError for a period
    that is not a multiple of 60, start >= end, a percentile outside 0..100 or more than
    MAX_DATAPOINTS periods."""
    _check_request(start, end, period, percentiles)
    s, m = _SERIES.c, _MINUTES.c
    series = session.execute(select(s.id, s.unit).where(
        s.account_id == account_id, s.namespace == namespace, s.name == name,
        s.dimensions == dimensions_key(dimensions))).first()
    if series is None or (unit is not None and unit != series.unit):
        return []
    cols = [m.minute, m.sample_count, m.sum, m.minimum, m.maximum]
    rows = session.execute(select(*cols, *([m.histogram] if percentiles else [])).where(
        m.series_id == series.id, m.minute >= math.floor(start / 60),
        m.minute < math.ceil(end / 60)).order_by(m.minute))
    periods: dict[int, tuple[Aggregate, list[Mapping[str, int]]]] = {}
    for r in rows:
        at = r.minute * 60 // period * period
        agg, hists = periods.setdefault(at, (Aggregate(), []))
        agg.merge(Aggregate(int(r.sample_count), r.sum, r.minimum, r.maximum))
        if percentiles:
            hists.append(r[5] or {})
    out = []
    for at, (agg, hists) in sorted(periods.items()):
        hist = merged(*hists)
        out.append(Stat(float(at), float(agg.sample_count), agg.sum, agg.minimum,
                        agg.maximum, series.unit,
                        {p: percentile(hist, p, agg.minimum, agg.maximum)
                         for p in percentiles}))
    return out


def list_metrics(session: Session, account_id: str, namespace: str | None, name: str | None,
                 dimension_filters: Sequence[tuple[str, str | None]],
                 since: float | None) -> list[tuple[str, str, Dimensions]]:
    """(namespace, name, dimensions) of the account's series, sorted. Each filter (name,
    value) keeps series having that dimension with that value (None: any value); `since`
    keeps series with data at or after it."""
    s = _SERIES.c
    stmt = select(s.namespace, s.name, s.dimensions).where(s.account_id == account_id)
    if namespace is not None:
        stmt = stmt.where(s.namespace == namespace)
    if name is not None:
        stmt = stmt.where(s.name == name)
    if since is not None:
        stmt = stmt.where(s.last_time >= since)
    out = []
    for r in session.execute(stmt):
        dims = _dimensions(r.dimensions)
        if all(any(k == want and (value is None or v == value) for k, v in dims)
               for want, value in dimension_filters):
            out.append((r.namespace, r.name, dims))
    return sorted(out)


def latest(session: Session, namespace: str, since: float) -> list[tuple[str, Datum]]:
    """Every account's series of `namespace` with data at or after `since`: (account id,
    the series' last minute as a Datum: value the minute's average, `at` its start),
    sorted by account, name and dimensions."""
    s, m = _SERIES.c, _MINUTES.c
    series = session.execute(select(s.id, s.account_id, s.name, s.dimensions, s.unit,
                                    s.last_time)
                             .where(s.namespace == namespace, s.last_time >= since)).all()
    keys = [(r.id, int(r.last_time // 60)) for r in series]
    avg: dict[tuple[int, int], float] = {}
    for i in range(0, len(keys), _CHUNK):
        for got in session.execute(
                select(m.series_id, m.minute, m.sample_count, m.sum)
                .where(tuple_(m.series_id, m.minute).in_(keys[i:i + _CHUNK]))):
            avg[got.series_id, got.minute] = got.sum / got.sample_count
    out = []
    for r in series:
        minute = int(r.last_time // 60)
        if (r.id, minute) in avg:
            out.append((r.account_id, Datum(namespace, r.name, _dimensions(r.dimensions),
                                            avg[r.id, minute], r.unit, minute * 60.0)))
    return sorted(out, key=lambda a: (a[0], a[1].name, a[1].dimensions))


def sweep(session: Session, now: float, retention_seconds: float) -> int:
    """Delete the minutes that ended `retention_seconds` before `now`, and the series left
    without data; returns the rows deleted."""
    cutoff = now - retention_seconds
    s, m = _SERIES.c, _MINUTES.c
    minutes = session.execute(_MINUTES.delete().where(m.minute < math.floor(cutoff / 60)))
    series = session.execute(_SERIES.delete().where(
        s.last_time < cutoff, ~exists().where(m.series_id == s.id)))
    return int(getattr(minutes, "rowcount", 0)) + int(getattr(series, "rowcount", 0))
