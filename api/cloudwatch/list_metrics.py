"""ListMetrics over the metric store: the caller's account's series (db/metrics_repo.py
`list_metrics`), filtered by namespace, metric name and dimensions (a filter without a
value matches any value of that dimension), RecentlyActive=PT3H for those with data in the
last three hours; 500 a page, as CloudWatch pages them.

The NextToken (foundation/page_tokens.py) is the last series of the page, fingerprinted by
the account and the filters: a series added between two pages is neither lost nor listed
twice. No account is linked to another: IncludeLinkedAccounts lists the caller's own, and
an OwningAccount other than the caller's lists nothing."""

from __future__ import annotations

import time
from typing import Any

from eaglenest.api.cloudwatch.service import operation
from eaglenest.api.edge.registry import Context
from eaglenest.db import metrics_repo
from eaglenest.foundation import page_tokens
from eaglenest.foundation.errors import InvalidParameterValue
from eaglenest.foundation.shapes.cloudwatch import (
    Dimension,
    ListMetricsInput,
    ListMetricsOutput,
    Metric,
)

PAGE = 500
RECENT_SECONDS = {"PT3H": 3 * 3600}
Series = tuple[str, str, metrics_repo.Dimensions]


def _key(series: Series) -> list[Any]:
    """A series as JSON (and as the token's cursor): [namespace, name, [[dim, value]...]]."""
    namespace, name, dims = series
    return [namespace, name, [list(pair) for pair in dims]]


def _valid_cursor(cursor: Any) -> bool:
    return (isinstance(cursor, list) and len(cursor) == 3
            and all(isinstance(part, str) for part in cursor[:2])
            and isinstance(cursor[2], list)
            and all(isinstance(pair, list) and len(pair) == 2
                    and all(isinstance(x, str) for x in pair) for pair in cursor[2]))


def _after(req: ListMetricsInput, fingerprint: str) -> list[Any] | None:
    if req.NextToken is None:
        return None
    try:
        cursor: list[Any] = page_tokens.decode(req.NextToken, fingerprint, _valid_cursor)
    except page_tokens.MalformedToken:
        raise InvalidParameterValue("The parameter NextToken is not valid: it is not a token "
                                    "ListMetrics returned for these filters.") from None
    return cursor


@operation("ListMetrics")
def list_metrics(ctx: Context, req: ListMetricsInput) -> ListMetricsOutput:
    account = ctx.account.account_id
    filters = [(f.Name, f.Value) for f in req.Dimensions or ()]
    query = {"account": account, "namespace": req.Namespace, "name": req.MetricName,
             "filters": filters, "recent": req.RecentlyActive, "owner": req.OwningAccount}
    after = _after(req, page_tokens.fingerprint(query))
    since = None if req.RecentlyActive is None else time.time() - RECENT_SECONDS[
        req.RecentlyActive]
    found: list[Series] = []
    if req.OwningAccount in (None, account):
        with ctx.db.session() as s:
            found = metrics_repo.list_metrics(s, account, req.Namespace, req.MetricName,
                                              filters, since)
    keys = sorted(_key(series) for series in found)
    if after is not None:
        keys = [k for k in keys if k > after]
    page = keys[:PAGE]
    token = None
    if len(keys) > PAGE:
        token = page_tokens.encode(page[-1], page_tokens.fingerprint(query))
    metrics = [Metric(Namespace=ns, MetricName=name,
                      Dimensions=[Dimension(Name=d, Value=v) for d, v in dims])
               for ns, name, dims in page]
    owners = [account] * len(page) if req.IncludeLinkedAccounts else None
    return ListMetricsOutput(Metrics=metrics, NextToken=token, OwningAccounts=owners)
