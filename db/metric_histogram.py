"""The metric store's per-minute aggregate: sample count, sum, minimum, maximum and a
histogram over fixed log-spaced buckets, from which percentiles are read.

Contract:
- Buckets are fixed (the same for every series, minute and host), so histograms of any
  minutes merge by adding counts per bucket: percentiles over a period of many minutes, or
  over data written by several hosts, come from the merged histogram.
- A positive value v is in bucket ``"p<i>"`` with i = ceil(log(v) / log(GAMMA)), i.e.
  GAMMA**(i-1) < v <= GAMMA**i; a negative value in ``"n<i>"`` by its magnitude; 0 in the
  zero bucket ``"z"`` (CloudWatch values may be 0 or negative). GAMMA = 1.04.
- A percentile is the nearest-rank one (the value of rank ceil(p/100 * N)), estimated as
  the point of its bucket (narrowed to [minimum, maximum]) with the least relative error:
  it is within (GAMMA - 1) / (GAMMA + 1), under 2%, of the exact value. p0 and p100 are the
  exact minimum and maximum; a minute of one distinct value gives it exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

#: the ratio of a bucket's upper bound to its lower one
GAMMA = 1.04
_LOG_GAMMA = math.log(GAMMA)
#: the largest relative error of a percentile (docs: "under 2%")
RELATIVE_ERROR = (GAMMA - 1) / (GAMMA + 1)
ZERO = "z"


def bucket_of(value: float) -> str:
    """The key of the bucket holding `value` (finite)."""
    if value == 0:
        return ZERO
    index = math.ceil(math.log(abs(value)) / _LOG_GAMMA)
    return f"{'p' if value > 0 else 'n'}{index}"


def _bounds(key: str) -> tuple[float, float]:
    """The bucket's [low, high] values (a negative bucket's are negative, low < high)."""
    if key == ZERO:
        return 0.0, 0.0
    index = int(key[1:])
    low, high = GAMMA ** (index - 1), GAMMA ** index
    return (low, high) if key[0] == "p" else (-high, -low)


def _order(key: str) -> float:
    low, high = _bounds(key)
    return (low + high) / 2


def _estimate(low: float, high: float) -> float:
    """The point of [low, high] (one sign) with the least worst-case relative error."""
    if low > high:
        low, high = high, low
    if low <= 0 <= high:
        return 0.0 if low == high or low == 0 or high == 0 else (low + high) / 2
    a, b = abs(low), abs(high)
    return math.copysign(2 * a * b / (a + b), low)


def percentile(histogram: Mapping[str, int], p: float, minimum: float,
               maximum: float) -> float:
    """The `p`th percentile (0..100) of the values counted in `histogram`, whose exact
    minimum and maximum are given; NaN for an empty histogram."""
    total = sum(histogram.values())
    if total <= 0:
        return math.nan
    rank = max(1, math.ceil(p / 100 * total - 1e-9))
    if rank >= total:
        return maximum
    if rank == 1:
        return minimum
    seen = 0
    for key in sorted(histogram, key=_order):
        seen += histogram[key]
        if seen >= rank:
            low, high = _bounds(key)
            return _estimate(max(low, minimum), min(high, maximum))
    return maximum


@dataclass
class Aggregate:
    """Data of one series in one minute: what one metric_minutes row holds."""

    sample_count: int = 0
    sum: float = 0.0
    minimum: float = math.inf
    maximum: float = -math.inf
    histogram: dict[str, int] = field(default_factory=dict)
    #: the time (epoch seconds) of its latest datum
    last_time: float = 0.0

    def add(self, value: float, at: float) -> None:
        self.sample_count += 1
        self.last_time = max(self.last_time, at)
        self.sum += value
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)
        key = bucket_of(value)
        self.histogram[key] = self.histogram.get(key, 0) + 1

    def merge(self, other: Aggregate) -> None:
        self.sample_count += other.sample_count
        self.sum += other.sum
        self.minimum = min(self.minimum, other.minimum)
        self.maximum = max(self.maximum, other.maximum)
        mine = self.histogram
        for key, count in other.histogram.items():
            mine[key] = mine.get(key, 0) + count
        self.last_time = max(self.last_time, other.last_time)


def merged(*histograms: Mapping[str, int]) -> dict[str, int]:
    """The bucket-wise sum of histograms."""
    out: dict[str, int] = {}
    for histogram in histograms:
        for key, count in histogram.items():
            out[key] = out.get(key, 0) + int(count)
    return out
