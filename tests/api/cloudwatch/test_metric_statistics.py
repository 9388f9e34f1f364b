"""GetMetricStatistics through boto3's unchanged `cloudwatch` client (Smithy RPC v2 CBOR),
and the AWS CLI's get-metric-statistics printing the same numbers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.api.cloudwatch.conftest import (
    INVOCATIONS,
    LATENCIES,
    OTHER_INVOCATIONS,
    T0,
    Caller,
    Series,
    at,
    error,
    served_as_json,
)
from tests.support.stack import ACCESS_KEY, REGION, SECRET_KEY, Stack

FIVE = ["SampleCount", "Average", "Sum", "Minimum", "Maximum"]


def invocations(cw: Any, series: Series, **kw: Any) -> dict[str, Any]:
    args = {"Namespace": "AWS/SageMaker", "MetricName": "Invocations",
            "Dimensions": series.dimensions, "StartTime": at(T0), "EndTime": at(T0 + 600),
            "Period": 60, "Statistics": ["Sum", "SampleCount"], **kw}
    return dict(cw.get_metric_statistics(**args))


def by_time(out: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(out["Datapoints"], key=lambda d: d["Timestamp"])


def test_sums_and_sample_counts_per_minute_are_what_was_recorded(cw, series):
    out = invocations(cw, series, Statistics=FIVE)
    assert out["Label"] == "Invocations"
    assert [(d["Timestamp"], d["Sum"], d["SampleCount"]) for d in by_time(out)] == [
        (at(T0 + 60 * m), float(n), float(n)) for m, n in enumerate(INVOCATIONS)]
    assert {(d["Average"], d["Minimum"], d["Maximum"], d["Unit"]) for d in out["Datapoints"]} \
        == {(1.0, 1.0, 1.0, "Count")}
    # dimensions in another order name the same series; two minutes a period
    out = invocations(cw, series, Dimensions=series.dimensions[::-1], Period=120,
                      Statistics=["Sum"])
    assert [(d["Timestamp"], d["Sum"]) for d in by_time(out)] == [
        (at(T0), float(INVOCATIONS[0] + INVOCATIONS[1])), (at(T0 + 120), float(INVOCATIONS[2]))]
    assert set(by_time(out)[0]) == {"Timestamp", "Sum", "Unit"}


def test_percentiles_lie_within_each_minutes_minimum_and_maximum(cw, series):
    out = cw.get_metric_statistics(
        Namespace="AWS/SageMaker", MetricName="ModelLatency", Dimensions=series.dimensions,
        StartTime=at(T0), EndTime=at(T0 + 600), Period=60, ExtendedStatistics=["p50", "p99"])
    points = by_time(out)
    assert [d["Timestamp"] for d in points] == [at(T0), at(T0 + 60)]
    for d, values in zip(points, LATENCIES, strict=True):
        assert d["Unit"] == "Microseconds" and set(d) == {"Timestamp", "Unit",
                                                          "ExtendedStatistics"}
        p50, p99 = d["ExtendedStatistics"]["p50"], d["ExtendedStatistics"]["p99"]
        assert min(values) <= p50 <= p99 <= max(values)
        exact = sorted(values)[len(values) // 2 - 1]  # nearest rank: ceil(0.5 * n)
        assert abs(p50 - exact) <= 0.02 * exact, (p50, exact)
    assert points[1]["ExtendedStatistics"]["p99"] == max(LATENCIES[1])


def test_another_accounts_key_sees_only_its_own_datapoints(cw, other: Caller, series):
    theirs = invocations(other.cw, series)
    assert [(d["Timestamp"], d["Sum"]) for d in theirs["Datapoints"]] == [
        (at(T0), float(OTHER_INVOCATIONS[0]))]
    loss = {"Namespace": "EagleNest/OptimizationJobs", "MetricName": "TrainingLoss",
            "Dimensions": [{"Name": "OptimizationJobName", "Value": series.endpoint}],
            "StartTime": at(T0), "EndTime": at(T0 + 600), "Period": 60,
            "Statistics": ["Maximum"]}
    assert [d["Maximum"] for d in cw.get_metric_statistics(**loss)["Datapoints"]] == [2.5]
    assert other.cw.get_metric_statistics(**loss)["Datapoints"] == []


def test_no_data_and_another_unit_give_no_datapoints(cw, series):
    assert invocations(cw, series, StartTime=at(T0 - 3600), EndTime=at(T0))["Datapoints"] == []
    assert invocations(cw, series, Unit="Seconds")["Datapoints"] == []
    assert len(invocations(cw, series, Unit="Count")["Datapoints"]) == len(INVOCATIONS)
    assert invocations(cw, series, Dimensions=series.dimensions[:1])["Datapoints"] == []


WRONG = [
    ({"Period": 90}, "InvalidParameterValue", "The parameter Period must be a multiple of 60."),
    ({"StartTime": at(T0 + 600), "EndTime": at(T0)}, "InvalidParameterValue",
     "The parameter StartTime must be less than the parameter EndTime."),
    ({"EndTime": at(T0 + 1441 * 60)}, "InvalidParameterCombination",
     "You have requested up to 1,441 datapoints, which exceeds the limit of 1,440. You may "
     "reduce the datapoints requested by increasing Period, or decreasing the time range."),
    ({"Statistics": ["Median"]}, "InvalidParameterValue",
     "1 validation error detected: Value 'Median' at 'statistics.1.member' failed to satisfy "
     "constraint: Member must satisfy enum value set: [SampleCount, Average, Sum, Minimum, "
     "Maximum]"),
    ({"Statistics": None, "ExtendedStatistics": ["p101"]}, "InvalidParameterValue",
     "The value p101 for parameter ExtendedStatistics.member.1 is not a supported statistic: "
     "use SampleCount, Average, Sum, Minimum, Maximum or a percentile p0 to p100 (at most two "
     "decimals, as in p99.9)."),
    ({"Statistics": None}, "InvalidParameterCombination",
     "Must specify either Statistics or ExtendedStatistics, but not both."),
    ({"ExtendedStatistics": ["p50"]}, "InvalidParameterCombination",
     "Must specify either Statistics or ExtendedStatistics, but not both."),
    ({"Dimensions": [{"Name": f"D{i}", "Value": "v"} for i in range(31)]},
     "InvalidParameterValue", "at 'dimensions' failed to satisfy constraint: Member must have "
     "length less than or equal to 30"),
    ({"Dimensions": [{"Name": "EndpointName", "Value": "a"},
                     {"Name": "EndpointName", "Value": "b"}]}, "InvalidParameterValue",
     "The parameter Dimensions names the dimension 'EndpointName' more than once."),
]


@pytest.mark.parametrize(("change", "code", "message"), WRONG,
                         ids=[w[1] + "-" + str(i) for i, w in enumerate(WRONG)])
def test_bad_input_gets_cloudwatchs_error_naming_the_field(cw, series, change, code, message):
    args = {k: v for k, v in {"Namespace": "AWS/SageMaker", "MetricName": "Invocations",
                              "Dimensions": series.dimensions, "StartTime": at(T0),
                              "EndTime": at(T0 + 600), "Period": 60,
                              "Statistics": ["Sum"], **change}.items() if v is not None}
    with pytest.raises(ClientError) as exc:
        cw.get_metric_statistics(**args)
    got_code, got_message, status = error(exc)
    assert (got_code, status) == (code, 400)
    assert message in got_message if message.startswith("at ") else got_message == message
    if code == "InvalidParameterValue":  # the model's exception class catches it too
        assert isinstance(exc.value, cw.exceptions.InvalidParameterValueException)


def epoch(printed: float | str) -> float:
    """A timestamp the CLI printed (epoch seconds, or ISO 8601) in epoch seconds."""
    if isinstance(printed, str):
        return datetime.fromisoformat(printed).timestamp()
    return float(printed)


def aws_cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
               AWS_DEFAULT_REGION=REGION, AWS_MAX_ATTEMPTS="1")
    beside = Path(sys.executable).parent / "aws"
    exe = str(beside) if beside.exists() else shutil.which("aws")
    cmd = [exe] if exe else [sys.executable, "-m", "awscli"]
    return subprocess.run([*cmd, "cloudwatch", *args, "--endpoint-url", stack.url,
                           "--output", "json"], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_aws_cli_prints_the_same_numbers(stack, series):
    served_as_json()
    dims = [f"Name={d['Name']},Value={d['Value']}" for d in series.dimensions]
    r = aws_cli(stack, "get-metric-statistics", "--namespace", "AWS/SageMaker",
                "--metric-name", "Invocations", "--dimensions", *dims,
                "--start-time", at(T0).isoformat(), "--end-time", at(T0 + 600).isoformat(),
                "--period", "60", "--statistics", "Sum", "SampleCount")
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout)
    assert printed["Label"] == "Invocations"
    # the CLI prints a timestamp as the service sent it (cli_timestamp_format "none")
    got = sorted((epoch(d["Timestamp"]), d["Sum"], d["SampleCount"])
                 for d in printed["Datapoints"])
    assert got == [(T0 + 60.0 * m, float(n), float(n)) for m, n in enumerate(INVOCATIONS)]
    r = aws_cli(stack, "get-metric-statistics", "--namespace", "AWS/SageMaker",
                "--metric-name", "Invocations", "--start-time", at(T0).isoformat(),
                "--end-time", at(T0 + 600).isoformat(), "--period", "90",
                "--statistics", "Sum")
    assert r.returncode != 0
    assert "(InvalidParameterValue)" in r.stderr
    assert "The parameter Period must be a multiple of 60." in r.stderr
