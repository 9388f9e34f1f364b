"""ListMetrics through boto3's `cloudwatch` client: the caller's series only, the
namespace / name / dimension filters, RecentlyActive, and 500-a-page NextToken paging."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.api.cloudwatch.conftest import T0, VARIANT, Caller, Series, error, put
from tests.support.stack import ACCOUNT

PAGED = 501  # series: a full page of 500 and one more


def listed(out: dict[str, Any]) -> list[tuple[str, str, tuple[tuple[str, str], ...]]]:
    return [(m["Namespace"], m["MetricName"],
             tuple((d["Name"], d["Value"]) for d in m["Dimensions"])) for m in out["Metrics"]]


def test_filters_by_namespace_name_and_dimensions(cw, series: Series):
    ep = series.endpoint
    dims = (("EndpointName", ep), ("VariantName", VARIANT))
    mine = {"Name": "EndpointName", "Value": ep}
    assert listed(cw.list_metrics(Dimensions=[mine])) == [
        ("AWS/SageMaker", "Invocations", dims), ("AWS/SageMaker", "ModelLatency", dims),
        ("AWS/SageMaker", "Spread", dims)]
    assert listed(cw.list_metrics(Namespace="AWS/SageMaker", MetricName="ModelLatency",
                                  Dimensions=[mine, {"Name": "VariantName"}])) == [
        ("AWS/SageMaker", "ModelLatency", dims)]
    assert listed(cw.list_metrics(Dimensions=[mine, {"Name": "VariantName",
                                                      "Value": "other"}])) == []
    assert listed(cw.list_metrics(Namespace="EagleNest/OptimizationJobs", Dimensions=[
        {"Name": "OptimizationJobName", "Value": ep}])) == [
        ("EagleNest/OptimizationJobs", "TrainingLoss", (("OptimizationJobName", ep),))]
    recent = cw.list_metrics(Dimensions=[mine], RecentlyActive="PT3H",
                             IncludeLinkedAccounts=True)
    assert [m["MetricName"] for m in recent["Metrics"]] == ["Invocations", "ModelLatency",
                                                            "Spread"]
    assert recent["OwningAccounts"] == [ACCOUNT] * 3
    assert cw.list_metrics(Dimensions=[mine], OwningAccount="999999999999")["Metrics"] == []


def test_another_accounts_key_lists_only_its_own_series(other: Caller, series: Series):
    out = other.cw.list_metrics(Dimensions=[{"Name": "EndpointName",
                                             "Value": series.endpoint}])
    assert [m["MetricName"] for m in out["Metrics"]] == ["Invocations"]


@pytest.fixture(scope="module")
def paged(db, account) -> str:
    """PAGED series of one namespace in the other account; the namespace."""
    from eaglenest.db.metrics_repo import Datum

    namespace = f"Test/Paging{T0}"
    put(db, account[0], [Datum(namespace, "M", (("Index", f"{i:04d}"),), 1.0, "Count", T0)
                         for i in range(PAGED)])
    return namespace


def test_pages_of_500_follow_next_token(other: Caller, paged: str):
    pages = list(other.cw.get_paginator("list_metrics").paginate(Namespace=paged))
    assert [len(p["Metrics"]) for p in pages] == [500, 1]
    indexes = [m["Dimensions"][0]["Value"] for p in pages for m in p["Metrics"]]
    assert indexes == [f"{i:04d}" for i in range(PAGED)]
    token = pages[0]["NextToken"]
    for wrong, kw in (("garbage", {"Namespace": paged}),
                      (token, {"Namespace": paged, "MetricName": "M"})):  # another query's
        with pytest.raises(ClientError) as exc:
            other.cw.list_metrics(NextToken=wrong, **kw)
        assert error(exc) == ("InvalidParameterValue", "The parameter NextToken is not valid: "
                              "it is not a token ListMetrics returned for these filters.", 400)


def test_too_many_dimension_filters_name_the_member(cw):
    with pytest.raises(ClientError) as exc:
        cw.list_metrics(Dimensions=[{"Name": f"D{i}"} for i in range(11)])
    code, message, status = error(exc)
    assert (code, status) == ("InvalidParameterValue", 400)
    assert "at 'dimensions' failed to satisfy constraint: Member must have length less " \
        "than or equal to 10" in message
