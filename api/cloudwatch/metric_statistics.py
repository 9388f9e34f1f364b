"""GetMetricStatistics over the metric store (db/metrics_repo.py `statistics`), for the
caller's account only.

CloudWatch's rules, with its error codes: Period a multiple of 60 (the store keeps minutes),
StartTime before EndTime, at most 1,440 datapoints, Statistics or ExtendedStatistics but
not both and not neither, percentiles p0 to p100, the dimensions of one series (an exact
match of its set of dimensions)."""

from __future__ import annotations

from eaglenest.api.cloudwatch import stats
from eaglenest.api.cloudwatch.service import operation
from eaglenest.api.edge.registry import Context
from eaglenest.db import metrics_repo
from eaglenest.foundation.errors import InvalidParameterCombination, InvalidParameterValue
from eaglenest.foundation.shapes.cloudwatch import (
    Datapoint,
    GetMetricStatisticsInput,
    GetMetricStatisticsOutput,
)

MAX_DATAPOINTS = 1440


def _percentiles(req: GetMetricStatisticsInput) -> dict[str, float]:
    """Each asked ExtendedStatistics name and its percentile."""
    asked: dict[str, float] = {}
    for i, name in enumerate(req.ExtendedStatistics or (), 1):
        p = stats.percentile(name)
        if p is None:
            raise stats.stat_error(name, f"ExtendedStatistics.member.{i}", InvalidParameterValue)
        asked[name] = p
    return asked


def _check(req: GetMetricStatisticsInput, start: float, end: float) -> None:
    if bool(req.Statistics) == bool(req.ExtendedStatistics):
        raise InvalidParameterCombination(
            "Must specify either Statistics or ExtendedStatistics, but not both.")
    stats.check_period(req.Period, "Period", InvalidParameterValue)
    stats.check_range(start, end, InvalidParameterValue)
    wanted = stats.datapoints(start, end, req.Period)
    if wanted > MAX_DATAPOINTS:
        raise InvalidParameterCombination(
            f"You have requested up to {wanted:,} datapoints, which exceeds the limit of "
            f"{MAX_DATAPOINTS:,}. You may reduce the datapoints requested by increasing "
            "Period, or decreasing the time range.")


@operation("GetMetricStatistics")
def get_metric_statistics(ctx: Context, req: GetMetricStatisticsInput
                          ) -> GetMetricStatisticsOutput:
    start, end = stats.epoch(req.StartTime), stats.epoch(req.EndTime)
    _check(req, start, end)
    asked = _percentiles(req)
    dims = stats.dimensions(req.Dimensions, "Dimensions", InvalidParameterValue)
    with ctx.db.session() as s:
        found = metrics_repo.statistics(
            s, ctx.account.account_id, req.Namespace, req.MetricName, dims, start, end,
            req.Period, req.Unit, sorted(set(asked.values())))
    points = []
    for stat in found:
        values = {name: stats.value_of(stat, name) for name in req.Statistics or ()}
        extended = {name: float(stat.percentiles[p]) for name, p in asked.items()}
        points.append(Datapoint(Timestamp=stats.at(stat.start), Unit=stats.unit(stat.unit),
                                ExtendedStatistics=extended or None, **values))
    return GetMetricStatisticsOutput(Label=req.MetricName, Datapoints=points)
