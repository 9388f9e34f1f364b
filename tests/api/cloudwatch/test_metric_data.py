"""GetMetricData through boto3's `cloudwatch` client: MetricStat queries, paging with
MaxDatapoints and NextToken, and the refusals (metric math, another account, bad queries)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.api.cloudwatch.conftest import (
    INVOCATIONS,
    LATENCIES,
    OTHER_INVOCATIONS,
    SPREAD,
    T0,
    Caller,
    Series,
    at,
    error,
)


def query(qid: str, name: str, stat: str, series: Series, period: int = 60,
          **kw: Any) -> dict[str, Any]:
    metric = {"Namespace": "AWS/SageMaker", "MetricName": name,
              "Dimensions": series.dimensions}
    return {"Id": qid, "MetricStat": {"Metric": metric, "Period": period, "Stat": stat}, **kw}


def data(cw: Any, queries: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return dict(cw.get_metric_data(MetricDataQueries=queries, StartTime=at(T0),
                                   EndTime=at(T0 + 600), **kw))


def test_metric_stat_queries_newest_first(cw, series):
    out = data(cw, [query("inv", "Invocations", "Sum", series),
                    query("lat", "ModelLatency", "p99", series, period=120, Label="latency"),
                    query("hidden", "Invocations", "SampleCount", series, ReturnData=False)])
    assert [r["Id"] for r in out["MetricDataResults"]] == ["inv", "lat"]
    inv, lat = out["MetricDataResults"]
    assert (inv["Label"], inv["StatusCode"]) == ("Invocations", "Complete")
    assert inv["Timestamps"] == [at(T0 + 120), at(T0 + 60), at(T0)]
    assert inv["Values"] == [float(n) for n in INVOCATIONS[::-1]]
    # both minutes of latency fall in one 120 s period: its p99 is their largest value
    assert (lat["Label"], lat["Timestamps"]) == ("latency", [at(T0)])
    assert lat["Values"] == [max(LATENCIES[0] + LATENCIES[1])]
    asc = data(cw, [query("inv", "Invocations", "Average", series)],
               ScanBy="TimestampAscending")["MetricDataResults"][0]
    assert asc["Timestamps"] == [at(T0), at(T0 + 60), at(T0 + 120)]
    assert asc["Values"] == [1.0, 1.0, 1.0]


def test_ranges_beyond_1440_periods_are_read_whole(cw, series):
    """Two days of minutes (GetMetricStatistics refuses such a range), read in windows of
    1,440 periods: SPREAD's data lie in two windows, in order either way, a page at a
    time."""
    days = {"StartTime": at(T0 - 2 * 86400 - 7), "EndTime": at(T0 + 600)}
    spread = query("s", "Spread", "Sum", series)
    out = cw.get_metric_data(MetricDataQueries=[spread], **days)["MetricDataResults"][0]
    assert list(zip(out["Timestamps"], out["Values"], strict=True)) == [
        (at(t), v) for v, t in SPREAD[::-1]]
    pages = []
    for scan in ("TimestampAscending", "TimestampDescending"):
        first = cw.get_metric_data(MetricDataQueries=[spread], ScanBy=scan, MaxDatapoints=1,
                                   **days)
        second = cw.get_metric_data(MetricDataQueries=[spread], ScanBy=scan,
                                    MaxDatapoints=1, NextToken=first["NextToken"], **days)
        assert "NextToken" not in second
        pages.append([(r["Values"], r["StatusCode"]) for r in
                      first["MetricDataResults"] + second["MetricDataResults"]])
    assert pages == [[([4.0], "PartialData"), ([6.0], "Complete")],
                     [([6.0], "PartialData"), ([4.0], "Complete")]]
    nothing = query("x", "Nothing", "Sum", series)
    assert cw.get_metric_data(MetricDataQueries=[nothing], **days)["MetricDataResults"] == [
        {"Id": "x", "Label": "Nothing", "Timestamps": [], "Values": [],
         "StatusCode": "Complete", "Messages": []}]


def test_another_accounts_key_reads_only_its_own(other: Caller, series):
    out = data(other.cw, [query("inv", "Invocations", "Sum", series),
                          query("lat", "ModelLatency", "p50", series)])
    inv, lat = out["MetricDataResults"]
    assert (inv["Timestamps"], inv["Values"]) == ([at(T0)], [float(OTHER_INVOCATIONS[0])])
    assert (lat["Timestamps"], lat["Values"], lat["StatusCode"]) == ([], [], "Complete")


def test_pages_of_max_datapoints_follow_next_token(cw, series):
    queries = [query("inv", "Invocations", "Sum", series),
               query("n", "Invocations", "SampleCount", series)]
    pages, token = [], None
    while True:
        out = data(cw, queries, MaxDatapoints=2, **({"NextToken": token} if token else {}))
        pages.append([(r["Id"], r["Values"], r["StatusCode"])
                      for r in out["MetricDataResults"]])
        token = out.get("NextToken")
        if not token:
            break
    newest_first = [float(n) for n in INVOCATIONS[::-1]]
    assert pages == [
        [("inv", newest_first[:2], "PartialData")],
        [("inv", newest_first[2:], "Complete"), ("n", newest_first[:1], "PartialData")],
        [("n", newest_first[1:], "Complete")],
    ]


def error_of(cw: Any, queries: list[dict[str, Any]], **kw: Any) -> tuple[str, str, int]:
    with pytest.raises(ClientError) as exc:
        data(cw, queries, **kw)
    return error(exc)


def test_math_expressions_are_refused_with_cloudwatchs_error(cw, series):
    got = error_of(cw, [query("m1", "Invocations", "Sum", series),
                        {"Id": "e1", "Expression": "m1 * 2"}])
    assert got == ("ValidationError",
                   "The parameter MetricDataQueries.member.2.Expression is not supported: "
                   "EagleNest serves MetricStat queries only, not metric math or search "
                   "expressions.", 400)


BAD = [
    ({"MetricStat": {"Period": 90}}, "The parameter MetricDataQueries.member.1.MetricStat."
     "Period must be a multiple of 60."),
    ({"MetricStat": {"Stat": "Median"}}, "The value Median for parameter MetricDataQueries."
     "member.1.MetricStat.Stat is not a supported statistic: use SampleCount, Average, Sum, "
     "Minimum, Maximum or a percentile p0 to p100 (at most two decimals, as in p99.9)."),
    ({"Id": "Upper"}, "The value Upper for parameter MetricDataQueries.member.1.Id is not "
     "valid: an Id starts with a lowercase letter and holds only letters, digits and "
     "underscores."),
    ({"AccountId": "999999999999"}, "The value 999999999999 for parameter MetricDataQueries."
     "member.1.AccountId is not valid: only the caller's own account can be read."),
    ({"MetricStat": None}, "The parameter MetricDataQueries.member.1.MetricStat is "
     "required."),
    ({"MetricStat": {"Metric": {"Namespace": "AWS/SageMaker"}}}, "The parameter "
     "MetricDataQueries.member.1.MetricStat.Metric.MetricName is required."),
]


@pytest.mark.parametrize(("change", "message"), BAD, ids=range(len(BAD)))
def test_bad_queries_get_validation_errors_naming_the_member(cw, series, change, message):
    q = query("m1", "Invocations", "Sum", series)
    for key, value in change.items():
        if isinstance(value, dict):
            q[key] = {**q[key], **value}
        elif value is None:
            del q[key]
        else:
            q[key] = value
    assert error_of(cw, [q]) == ("ValidationError", message, 400)


def test_request_errors(cw, series):
    q = [query("m1", "Invocations", "Sum", series)]
    assert error_of(cw, q + q) == (
        "ValidationError", "The values for parameter id in MetricDataQueries are not unique: "
        "m1 is used more than once.", 400)
    assert error_of(cw, q, MaxDatapoints=0) == (
        "ValidationError", "The parameter MaxDatapoints must be 1 to 100800.", 400)
    with pytest.raises(ClientError) as exc:
        cw.get_metric_data(MetricDataQueries=q, StartTime=at(T0), EndTime=at(T0))
    assert error(exc) == ("ValidationError", "The parameter StartTime must be less than the "
                          "parameter EndTime.", 400)
    token = data(cw, q, MaxDatapoints=1)["NextToken"]
    for wrong in ("not-a-token", token):  # the second: a token of another request
        got = error_of(cw, q, MaxDatapoints=2, NextToken=wrong)
        assert got == ("InvalidNextToken", "The parameter NextToken is not valid: it is not "
                       "a token GetMetricData returned for this request.", 400)
