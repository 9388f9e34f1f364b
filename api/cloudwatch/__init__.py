"""CloudWatch's read operations (GetMetricStatistics, GetMetricData, ListMetrics) over the
metric store, SigV4-signed like every other service (docs/observability.md)."""

from __future__ import annotations

from fastapi import FastAPI

from eaglenest.api.edge.registry import Context


def install(app: FastAPI, ctx: Context) -> None:
    """Mount CloudWatch's routes on `app`."""
