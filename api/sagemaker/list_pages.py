"""Small helpers the thin handlers share: a request's stored form, the List* query and the
replies of resources without a lifecycle (models, endpoint configs)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from eaglenest.db.repository import ListQuery
from eaglenest.foundation.shapes import AwsShape, to_wire

Reply = TypeVar("Reply", bound=AwsShape)

DEFAULT_MAX_RESULTS = 10


class Resource(Protocol):
    """What a resource's row gives its replies (db/tables.py)."""

    name: str
    arn: str
    creation_time: float
    spec: dict[str, Any]


class ListInput(Protocol):
    """The members every SageMaker List* input has (botocore's names). SortBy and SortOrder
    are read-only here, so each operation's own enum of them fits."""

    MaxResults: int | None
    NextToken: str | None
    NameContains: str | None
    CreationTimeAfter: datetime | None
    CreationTimeBefore: datetime | None

    @property
    def SortBy(self) -> str | None: ...
    @property
    def SortOrder(self) -> str | None: ...


def spec_of(request: AwsShape) -> dict[str, Any]:
    """What the database stores of a Create/Update request: its members exactly as the
    caller set them (wire names, no nulls), but its Tags, which the row holds apart."""
    return {k: v for k, v in to_wire(request).items() if k != "Tags"}


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


def page(reply: type[Reply], key: str, items: Sequence[object], token: str | None) -> Reply:
    """A List* reply: `items` (summary shapes or their wire dicts) under `key`, and the
    NextToken when there is a next page."""
    members: dict[str, Any] = {key: items}
    if token:
        members["NextToken"] = token
    return reply.model_validate(members)


def described(reply: type[Reply], row: Resource, kind: str) -> Reply:
    """Describe<kind>'s reply: the stored request, its <kind>Arn and CreationTime."""
    return reply.model_validate({**row.spec, f"{kind}Arn": row.arn,
                                 "CreationTime": row.creation_time})


def named_page(reply: type[Reply], key: str, kind: str, rows: Sequence[Resource],
               token: str | None) -> Reply:
    """List<kind>s' reply: each row's <kind>Name, <kind>Arn and CreationTime."""
    items = [{f"{kind}Name": r.name, f"{kind}Arn": r.arn, "CreationTime": r.creation_time}
             for r in rows]
    return page(reply, key, items, token)
