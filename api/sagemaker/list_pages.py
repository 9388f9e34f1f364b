"""Small helpers the thin handlers share."""

from __future__ import annotations

from typing import Any

from eaglenest.db.repository import ListQuery
from eaglenest.foundation.shapes import AwsShape, to_wire
from eaglenest.foundation.shapes.endpoint_configs import ListEndpointConfigsInput
from eaglenest.foundation.shapes.endpoints import ListEndpointsInput
from eaglenest.foundation.shapes.models import ListModelsInput
from eaglenest.foundation.shapes.optimization_jobs import ListOptimizationJobsRequest

ListInput = (ListModelsInput | ListEndpointConfigsInput | ListEndpointsInput
             | ListOptimizationJobsRequest)

DEFAULT_MAX_RESULTS = 10


def spec_of(request: AwsShape) -> dict[str, Any]:
    """The request's members exactly as the caller set them (wire names, no nulls)."""
    return to_wire(request)


def list_query(request: ListInput, *, default_order: str = "Descending", default_max: int = 10,
               status: str | None = None) -> ListQuery:
    order = request.SortOrder or default_order
    return ListQuery(
        sort_by=request.SortBy or "CreationTime",
        descending=order == "Descending",
        max_results=request.MaxResults or default_max,
        next_token=request.NextToken,
        name_contains=request.NameContains,
        creation_after=request.CreationTimeAfter,
        creation_before=request.CreationTimeBefore,
        modified_after=getattr(request, "LastModifiedTimeAfter", None),
        modified_before=getattr(request, "LastModifiedTimeBefore", None),
        status_equals=status,
    )


def page(key: str, items: list[dict[str, Any]], token: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {key: items}
    if token:
        out["NextToken"] = token
    return out
