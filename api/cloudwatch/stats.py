"""What GetMetricStatistics and GetMetricData share: the statistics CloudWatch names
(SampleCount, Average, Sum, Minimum, Maximum, and percentiles pNN.NN), the checks of a
period, a time range and a set of dimensions, and the value of a statistic in one of the
store's periods (db/metrics_repo.py `Stat`).

Each check raises the error class its caller passes: GetMetricStatistics words its input
errors as InvalidParameterValue, GetMetricData as ValidationError."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import get_args

from eaglenest.db.metrics_repo import Dimensions, Stat
from eaglenest.foundation.errors import CloudWatchError
from eaglenest.foundation.shapes.cloudwatch import Dimension, T_StandardUnit

STATISTICS = ("SampleCount", "Average", "Sum", "Minimum", "Maximum")
#: the store keeps one-minute aggregates: a period is a whole number of minutes
MINUTE = 60
#: a percentile statistic: p0 to p100, at most two decimals (CloudWatch's pNN.NN)
_PERCENTILE = re.compile(r"p(\d{1,3}(?:\.\d{1,2})?)")


def percentile(stat: str) -> float | None:
    """The percentile `stat` names (p99 -> 99.0, p99.9 -> 99.9), None if it names none."""
    m = _PERCENTILE.fullmatch(stat)
    if m is None:
        return None
    value = float(m[1])
    return value if value <= 100 else None


def value_of(stat: Stat, name: str) -> float:
    """One statistic of a period (`name` one of STATISTICS or a valid percentile)."""
    if name == "SampleCount":
        return float(stat.sample_count)
    if name == "Average":
        return float(stat.sum / stat.sample_count) if stat.sample_count else 0.0
    if name == "Sum":
        return float(stat.sum)
    if name == "Minimum":
        return float(stat.minimum)
    if name == "Maximum":
        return float(stat.maximum)
    p = percentile(name)
    if p is None:
        raise ValueError(f"not a statistic: {name}")
    return float(stat.percentiles[p])


def unit(text: str) -> T_StandardUnit:
    """A stored unit as a StandardUnit (one the model does not know is "None")."""
    for known in get_args(T_StandardUnit):
        if text == known:
            return known  # type: ignore[no-any-return]
    return "None"


def epoch(when: datetime) -> float:
    return when.timestamp()


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def check_period(period: int, field: str, error: type[CloudWatchError]) -> None:
    """A period of whole minutes (the store's resolution: CloudWatch's high-resolution
    periods of 1, 5, 10 and 30 seconds are refused)."""
    if period % MINUTE:
        raise error(f"The parameter {field} must be a multiple of {MINUTE}.")


def check_range(start: float, end: float, error: type[CloudWatchError]) -> None:
    if start >= end:
        raise error("The parameter StartTime must be less than the parameter EndTime.")


def datapoints(start: float, end: float, period: int) -> int:
    """How many periods (aligned to the epoch, as the store keeps them) [start, end)
    touches."""
    return math.ceil(end / period) - math.floor(start / period)


def dimensions(given: Sequence[Dimension] | None, field: str,
               error: type[CloudWatchError]) -> Dimensions:
    """The store's form of a metric's dimensions: (name, value) pairs sorted by name; a name
    given twice is refused."""
    pairs = sorted((d.Name, d.Value) for d in given or ())
    for (a, _), (b, _) in zip(pairs, pairs[1:], strict=False):
        if a == b:
            raise error(f"The parameter {field} names the dimension '{a}' more than once.")
    return tuple(pairs)


def stat_error(stat: str, field: str, error: type[CloudWatchError]) -> CloudWatchError:
    return error(
        f"The value {stat} for parameter {field} is not a supported statistic: use "
        f"{', '.join(STATISTICS)} or a percentile p0 to p100 (at most two decimals, "
        "as in p99.9).")
