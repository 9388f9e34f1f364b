"""GetMetricData over the metric store, for the caller's account: MetricStat queries only.

A query with an Expression (metric math, SEARCH, Metrics Insights) is refused with
CloudWatch's ValidationError naming it; so is a query that names another account
(cross-account observability is not kept). Every check runs before anything is read.

Paging: at most MaxDatapoints values (default and most: CloudWatch's 100,800) per page,
across the queries in their order; a query cut short is `PartialData` and the NextToken
(foundation/page_tokens.py, fingerprinted by the request without its NextToken) says which
query and which period go on.

Bounded work: the range read is cut to the retention (Settings.metrics_retention_days)
and two hours ahead; a query is read in windows of at most 1,440 periods (what one
metrics_repo.statistics call answers), in scan order, so a page reads little more than it
returns, and a query spanning several windows first looks once for any data at all."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from sqlalchemy.orm import Session

from eaglenest.api.cloudwatch import stats
from eaglenest.api.cloudwatch.service import operation
from eaglenest.api.edge.registry import Context
from eaglenest.db import metrics_repo
from eaglenest.foundation import page_tokens
from eaglenest.foundation.errors import CloudWatchValidationError, InvalidNextToken
from eaglenest.foundation.shapes import to_wire
from eaglenest.foundation.shapes.cloudwatch import (
    GetMetricDataInput,
    GetMetricDataOutput,
    MetricDataQuery,
    MetricDataResult,
)

MAX_QUERIES = 500
MAX_DATAPOINTS = 100_800
#: periods per metrics_repo.statistics call
WINDOW = metrics_repo.MAX_DATAPOINTS
#: how far ahead of now data may lie (CloudWatch takes data up to two hours ahead)
AHEAD_SECONDS = 2 * 3600
_ID = re.compile(r"[a-z][a-zA-Z0-9_]*")
Error = CloudWatchValidationError


@dataclass(frozen=True)
class Plan:
    """One MetricStat query, checked: what to read and how to report it."""

    id: str
    label: str
    namespace: str
    name: str
    dimensions: metrics_repo.Dimensions
    period: int
    stat: str
    unit: str | None


def _plan(i: int, q: MetricDataQuery, account: str) -> Plan:
    where = f"MetricDataQueries.member.{i}"
    if _ID.fullmatch(q.Id) is None:
        raise Error(f"The value {q.Id} for parameter {where}.Id is not valid: an Id starts "
                    "with a lowercase letter and holds only letters, digits and underscores.")
    if q.Expression is not None:
        raise Error(f"The parameter {where}.Expression is not supported: EagleNest serves "
                    "MetricStat queries only, not metric math or search expressions.")
    if q.AccountId is not None and q.AccountId != account:
        raise Error(f"The value {q.AccountId} for parameter {where}.AccountId is not valid: "
                    "only the caller's own account can be read.")
    if q.MetricStat is None:
        raise Error(f"The parameter {where}.MetricStat is required.")
    ms, metric = q.MetricStat, q.MetricStat.Metric
    for member in ("Namespace", "MetricName"):
        if getattr(metric, member) is None:
            raise Error(f"The parameter {where}.MetricStat.Metric.{member} is required.")
    assert metric.Namespace is not None and metric.MetricName is not None
    stats.check_period(ms.Period, f"{where}.MetricStat.Period", Error)
    if ms.Stat not in stats.STATISTICS and stats.percentile(ms.Stat) is None:
        raise stats.stat_error(ms.Stat, f"{where}.MetricStat.Stat", Error)
    dims = stats.dimensions(metric.Dimensions, f"{where}.MetricStat.Metric.Dimensions", Error)
    return Plan(q.Id, q.Label or metric.MetricName, metric.Namespace, metric.MetricName,
                dims, ms.Period, ms.Stat, ms.Unit)


def _plans(req: GetMetricDataInput, account: str) -> list[Plan]:
    queries = req.MetricDataQueries
    if not queries:
        raise Error("The parameter MetricDataQueries must hold at least one query.")
    if len(queries) > MAX_QUERIES:
        raise Error(f"The collection MetricDataQueries must not have more than {MAX_QUERIES} "
                    "members.")
    plans = [_plan(i, q, account) for i, q in enumerate(queries, 1)]
    seen: set[str] = set()
    for p in plans:
        if p.id in seen:
            raise Error(f"The values for parameter id in MetricDataQueries are not unique: "
                        f"{p.id} is used more than once.")
        seen.add(p.id)
    return [p for p, q in zip(plans, queries, strict=True) if q.ReturnData is not False]


def _valid_cursor(cursor: Any) -> bool:
    """[query index, the last period start returned of it (None: the query's first)]."""
    return (isinstance(cursor, list) and len(cursor) == 2
            and page_tokens.is_offset(cursor[0])
            and (cursor[1] is None or isinstance(cursor[1], int | float)))


def _cursor(req: GetMetricDataInput, fingerprint: str) -> tuple[int, float | None]:
    if req.NextToken is None:
        return 0, None
    try:
        index, edge = page_tokens.decode(req.NextToken, fingerprint, _valid_cursor)
    except page_tokens.MalformedToken:
        raise InvalidNextToken("The parameter NextToken is not valid: it is not a token "
                               "GetMetricData returned for this request.") from None
    return int(index), edge


def _windows(lo: float, hi: float, period: int, descending: bool
             ) -> Iterator[tuple[float, float]]:
    """[lo, hi) cut at period boundaries into ranges of at most WINDOW periods (what one
    metrics_repo.statistics call answers), in scan order."""
    while lo < hi:
        if descending:
            cut = max(lo, (math.ceil(hi / period) - WINDOW) * period)
            yield cut, hi
            hi = cut
        else:
            cut = min(hi, (math.floor(lo / period) + WINDOW) * period)
            yield lo, cut
            lo = cut


def _points(s: Session, account: str, plan: Plan, lo: float, hi: float, descending: bool
            ) -> Iterator[tuple[float, float]]:
    """(period start, value) of one query in scan order, read a window at a time (so a
    page reads little more than it returns)."""
    if hi - lo > WINDOW * plan.period:  # several windows: first, one look for any data
        whole = math.ceil((hi - lo) / stats.MINUTE) * stats.MINUTE
        if not metrics_repo.statistics(s, account, plan.namespace, plan.name,
                                       plan.dimensions, lo, hi, whole, plan.unit):
            return
    p = stats.percentile(plan.stat)
    for a, b in _windows(lo, hi, plan.period, descending):
        found = metrics_repo.statistics(s, account, plan.namespace, plan.name,
                                        plan.dimensions, a, b, plan.period, plan.unit,
                                        () if p is None else (p,))
        points = [(st.start, stats.value_of(st, plan.stat)) for st in found]
        yield from (reversed(points) if descending else points)


def _bounds(plan: Plan, start: float, end: float, edge: float | None, descending: bool
            ) -> tuple[float, float]:
    """The range left to read of a query a page cut short after the period at `edge`."""
    if edge is None:
        return start, end
    if descending:
        return start, min(end, edge)
    return max(start, edge + plan.period), end


@operation("GetMetricData")
def get_metric_data(ctx: Context, req: GetMetricDataInput) -> GetMetricDataOutput:
    start, end = stats.epoch(req.StartTime), stats.epoch(req.EndTime)
    stats.check_range(start, end, Error)
    account = ctx.account.account_id
    plans = _plans(req, account)
    budget = MAX_DATAPOINTS if req.MaxDatapoints is None else req.MaxDatapoints
    if not 1 <= budget <= MAX_DATAPOINTS:
        raise Error(f"The parameter MaxDatapoints must be 1 to {MAX_DATAPOINTS}.")
    fingerprint = page_tokens.fingerprint(
        [account, to_wire(req.model_copy(update={"NextToken": None}))])
    index, edge = _cursor(req, fingerprint)
    descending = req.ScanBy != "TimestampAscending"
    # nothing is kept before the retention nor written far ahead: read no further
    now = time.time()
    start = max(start, now - ctx.settings.metrics_retention_days * 86400)
    end = min(end, now + AHEAD_SECONDS)
    results, token = [], None
    with ctx.db.session() as s:
        for i in range(index, len(plans)):
            lo, hi = _bounds(plans[i], start, end, edge if i == index else None, descending)
            points = _points(s, account, plans[i], lo, hi, descending)
            page = list(islice(points, budget))
            more = next(points, None) is not None
            budget -= len(page)
            results.append(MetricDataResult(
                Id=plans[i].id, Label=plans[i].label, Timestamps=[stats.at(t) for t, _ in page],
                Values=[v for _, v in page], Messages=[],
                StatusCode="PartialData" if more else "Complete"))
            if more:
                token = page_tokens.encode([i, page[-1][0]], fingerprint)
            elif budget == 0 and i + 1 < len(plans):
                token = page_tokens.encode([i + 1, None], fingerprint)
            if token is not None:
                break
    return GetMetricDataOutput(MetricDataResults=results, NextToken=token, Messages=[])
