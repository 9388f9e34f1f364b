"""The metric store: per account, per series, per minute aggregates (skeleton, #54)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

Dimensions = tuple[tuple[str, str], ...]


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

    start: float
    sample_count: float
    sum: float
    minimum: float
    maximum: float
    unit: str
    percentiles: dict[float, float] = field(default_factory=dict)


def record(session: Session, account_id: str, data: Iterable[Datum], max_series: int) -> int:
    raise NotImplementedError


def statistics(session: Session, account_id: str, namespace: str, name: str,
               dimensions: Dimensions, start: float, end: float, period: int,
               unit: str | None = None, percentiles: Sequence[float] = ()) -> list[Stat]:
    raise NotImplementedError


def list_metrics(session: Session, account_id: str, namespace: str | None, name: str | None,
                 dimension_filters: Sequence[tuple[str, str | None]],
                 since: float | None) -> list[tuple[str, str, Dimensions]]:
    raise NotImplementedError


def latest(session: Session, namespace: str, since: float) -> list[tuple[str, Datum]]:
    raise NotImplementedError


def sweep(session: Session, now: float, retention_seconds: float) -> int:
    raise NotImplementedError
