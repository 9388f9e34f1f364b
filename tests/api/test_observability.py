"""The API's metrics (api/observability.py, api/runtime/metering.py): boto3 sagemaker-runtime
calls to an endpoint served by a stand-in model server (tests/support/fake_model_server.py)
show on /metrics per (account, endpoint, variant), parsed with prometheus_client's parser,
and in the metric store as SageMaker's "AWS/SageMaker" data of the caller's account
(db/metrics_repo.py); 4XX and 5XX are told apart as SageMaker does; the MetricBuffer is
flushed and its thread gone when the app shuts down; with PROMETHEUS_MULTIPROC_DIR a scrape
sums every process's counters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError
from prometheus_client.parser import text_string_to_metric_families

from eaglenest.db import endpoints_repo, metrics_repo
from eaglenest.db.session import Database
from eaglenest.foundation.host.processes import free_port
from eaglenest.foundation.http.instance_auth import SECRET_ENV, probe
from tests.support.stack import ACCESS_KEY, ACCOUNT, REGION, SECRET_KEY, Stack, wait_for

ROOT = Path(__file__).resolve().parents[2]
SECRET = "metering-instance-secret"
NS = "AWS/SageMaker"
VARIANT = "AllTraffic"
OK_BODY = json.dumps({"prompt": "The quick brown fox", "max_tokens": 3})


@pytest.fixture(scope="module")
def model_server() -> Iterator[str]:
    """One stand-in model server; both instances of every endpoint here point at it."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_model_server", "--name", "fake",
         "--port", str(port)], cwd=ROOT, env={**os.environ, SECRET_ENV: SECRET})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: probe(url, SECRET, timeout=1) or proc.poll() is not None, 30,
                 "the stand-in model server did not answer")
        assert proc.poll() is None
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def new_account(stack: Stack) -> tuple[str, dict[str, str]]:
    """A key of a new account (`eaglenest keys create --new-account`): its id and creds."""
    r = subprocess.run([sys.executable, "-m", "eaglenest.cli", "keys", "create", "--name",
                        "metrics-bob", "--new-account"], env=stack.env(), cwd=ROOT,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    out = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    return out["account"], {"key": out["access key id"], "secret": out["secret access key"]}


def serve(stack: Stack, url: str, name: str, account: str, **creds: str) -> None:
    """Endpoint `name` of `account`, InService on two instances at `url` (the API-only
    stack has no serve worker: its deployment is written as a worker writes it)."""
    sm = stack.client(**creds)
    sm.create_model(ModelName=name, ExecutionRoleArn=f"arn:aws:iam::{account}:role/R",
                    PrimaryContainer={"Image": "x"})
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
        "VariantName": VARIANT, "ModelName": name, "InstanceType": "ml.m5.large",
        "InitialInstanceCount": 2}])
    arn = sm.create_endpoint(EndpointName=name, EndpointConfigName=name)["EndpointArn"]
    instance = {"url": url, "secret": SECRET}
    db = Database(stack.database_url)
    try:
        with db.session() as s:
            assert endpoints_repo.mark_in_service(s, arn, {"Servers": {VARIANT: {
                "instances": [instance, instance], "served_name": "fake"}}})
    finally:
        db.dispose()


def error_code(call: Any) -> tuple[str, Any]:
    with pytest.raises(ClientError) as exc:
        call()
    return exc.value.response["Error"]["Code"], exc.value.response


@pytest.fixture(scope="module")
def invoked(stack: Stack, model_server: str) -> dict[str, Any]:
    """Invocations of one endpoint of the stack's account: 3 that succeed, 1 stream, one
    body the container does not take (a 4XX), one the model server fails on (its 500: a
    5XX), one of an endpoint that does not exist (counted nowhere per endpoint); and one of
    an endpoint of the same name of another account."""
    name = f"metered-{int(time.time() * 1000) % 10**8}"
    other, creds = new_account(stack)
    serve(stack, model_server, name, ACCOUNT)
    serve(stack, model_server, name, other, **creds)
    rt = stack.client("sagemaker-runtime")
    spans: list[tuple[float, float]] = []

    def timed(call: Any) -> Any:
        start = time.time()
        try:
            return call()
        finally:
            spans.append((start, time.time()))

    for _ in range(3):
        r = timed(lambda: rt.invoke_endpoint(EndpointName=name, Body=OK_BODY,
                                             ContentType="application/json"))
        assert json.loads(r["Body"].read())["server"] == "fake"
    stream = timed(lambda: rt.invoke_endpoint_with_response_stream(
        EndpointName=name, Body=OK_BODY, ContentType="application/json"))
    assert sum(1 for _ in stream["Body"]) == 3
    code, bad = timed(lambda: error_code(lambda: rt.invoke_endpoint(
        EndpointName=name, Body=b'{"neither": 1}', ContentType="application/json")))
    assert (code, bad["OriginalStatusCode"]) == ("ModelError", 400)
    code, failed = timed(lambda: error_code(lambda: rt.invoke_endpoint(
        EndpointName=name, ContentType="application/json",
        Body=json.dumps({"prompt": "x", "delay": "not a number"}))))
    assert (code, failed["OriginalStatusCode"]) == ("ModelError", 500)
    assert error_code(lambda: rt.invoke_endpoint(
        EndpointName=f"{name}-missing", Body=OK_BODY,
        ContentType="application/json"))[0] == "ValidationError"
    stack.client("sagemaker-runtime", **creds).invoke_endpoint(
        EndpointName=name, Body=OK_BODY, ContentType="application/json")
    return {"name": name, "other": other, "creds": creds, "spans": spans}


def stats(stack: Stack, account: str, name: str, metric: str, start: float,
          percentiles: tuple[float, ...] = ()) -> list[metrics_repo.Stat]:
    dims = (("EndpointName", name), ("VariantName", VARIANT))
    db = Database(stack.database_url)
    try:
        with db.session() as s:
            return metrics_repo.statistics(s, account, NS, metric, dims, start - 120,
                                           time.time() + 120, 60, percentiles=percentiles)
    finally:
        db.dispose()


def test_the_store_has_each_invocation_of_the_callers_account(stack, invoked) -> None:
    name, spans = invoked["name"], invoked["spans"]
    start = spans[0][0]

    def written() -> list[metrics_repo.Stat] | None:
        # both accounts' calls: each API process flushes its own buffer, so the other
        # account's one call may land a flush later than these six
        rows = stats(stack, ACCOUNT, name, "Invocations", start)
        other = stats(stack, invoked["other"], name, "Invocations", start)
        done = sum(s.sample_count for s in rows) == 6 and other
        return rows if done else None

    got = wait_for(written, 15, "the invocations never reached the store", stack)
    # per minute: what the test sent in that minute (a call that straddled a minute's
    # end counts in one of the two: then only the total is exact)
    if all(int(a // 60) == int(b // 60) for a, b in spans):
        want = Counter(int(b // 60) * 60 for _, b in spans)
        assert {int(s.start): s.sum for s in got} == want
        assert {int(s.start): s.sample_count for s in got} == want
    assert sum(s.sum for s in got) == 6 and all(s.unit == "Count" for s in got)

    def total(metric: str) -> tuple[float, float]:
        rows = stats(stack, ACCOUNT, name, metric, start)
        return sum(s.sample_count for s in rows), sum(s.sum for s in rows)

    assert total("Invocation4XXErrors") == (6, 1)
    assert total("Invocation5XXErrors") == (6, 1)
    assert total("InvocationsPerInstance") == (6, 3.0)  # two instances
    assert total("OverheadLatency")[0] == 6
    # every call that the model server answered to its end: not the refused body
    assert total("ModelLatency")[0] == 5
    (latency,) = {s.unit for s in stats(stack, ACCOUNT, name, "ModelLatency", start)}
    assert latency == "Microseconds"
    p = stats(stack, ACCOUNT, name, "ModelLatency", start, (50.0, 99.0))
    assert all(0 < s.percentiles[50.0] <= s.percentiles[99.0] for s in p)
    # the other account's endpoint of the same name: its one call, and none of these
    other = stats(stack, invoked["other"], name, "Invocations", start)
    assert sum(s.sum for s in other) == 1
    assert stats(stack, "999999999999", name, "Invocations", start) == []


def families(stack: Stack) -> dict[str, Any]:
    r = httpx.get(f"{stack.url}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def value(fams: dict[str, Any], family: str, sample: str, **labels: str) -> float:
    found = [s.value for s in fams[family].samples
             if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (sample, labels, fams[family].samples)
    return float(found[0])


def test_metrics_scrape_parses_and_has_the_endpoints_series(stack, invoked) -> None:
    fams = families(stack)
    mine = {"account": ACCOUNT, "endpoint": invoked["name"], "variant": VARIANT}
    theirs = {**mine, "account": invoked["other"]}
    fam = "eaglenest_endpoint_invocations"
    assert value(fams, fam, fam + "_total", **mine) == 6
    assert value(fams, fam, fam + "_total", **theirs) == 1
    fam = "eaglenest_endpoint_invocation_4xx_errors"
    assert value(fams, fam, fam + "_total", **mine) == 1
    assert value(fams, fam, fam + "_total", **theirs) == 0
    fam = "eaglenest_endpoint_invocation_5xx_errors"
    assert value(fams, fam, fam + "_total", **mine) == 1
    fam = "eaglenest_endpoint_model_latency_microseconds"
    assert fams[fam].type == "histogram"
    assert value(fams, fam, fam + "_count", **mine) == 5
    assert value(fams, fam, fam + "_bucket", le="+Inf", **mine) == 5
    assert value(fams, fam, fam + "_sum", **mine) > 5 * 100  # microseconds, not seconds
    fam = "eaglenest_endpoint_overhead_latency_microseconds"
    assert value(fams, fam, fam + "_count", **mine) == 6
    # the process-wide counters of before stay (scripts and older tests read them)
    fam = "eaglenest_runtime_invocations"
    assert value(fams, fam, fam + "_total", code="ModelError") >= 2
    assert value(fams, "eaglenest_database_up", "eaglenest_database_up") == 1
    assert value(fams, "eaglenest_endpoints", "eaglenest_endpoints", status="InService") >= 2
    # the stack sets no EAGLENEST_METRICS_TOKEN: a loopback client reads it (above), one
    # that says a proxy forwarded it does not, whatever address it names (uvicorn's stack)
    r = httpx.get(f"{stack.url}/metrics", headers={"X-Forwarded-For": "127.0.0.1"},
                  timeout=10)
    assert r.status_code == 403 and "EAGLENEST_METRICS_TOKEN" in r.text


def _app(data_dir: Path, **settings_: Any) -> Any:
    from eaglenest.api.app import create_app
    from eaglenest.db.migrate import upgrade_head
    from eaglenest.foundation.settings import Settings

    settings = Settings(data_dir=data_dir, region="us-east-1", metrics_flush_seconds=60,
                        **settings_)
    upgrade_head(settings.resolved_database_url())
    return settings, create_app(settings, "redis://127.0.0.1:1/0")


def test_shutdown_writes_what_the_buffer_holds_and_ends_its_thread(tmp_path) -> None:
    from starlette.testclient import TestClient

    from eaglenest.api.observability import Invocation

    settings, app = _app(tmp_path)
    before = set(threading.enumerate())
    with TestClient(app):
        # the buffer's flusher (db/metric_buffer.py names it); the test client's own
        # threads (its portal, anyio's workers) are not the app's to end
        started = {t for t in set(threading.enumerate()) - before
                   if t.name == "metric-buffer"}
        assert started, "the lifespan started no flusher thread"
        # a flush period far longer than the test: only close() can write it
        app.state.metrics.invocation(Invocation("123456789012", "ep", "v", 1, 200, 0.01,
                                                0.0001))
    assert not [t for t in started if t.is_alive()]
    db = Database(settings.resolved_database_url())
    try:
        with db.session() as s:
            rows = metrics_repo.statistics(s, "123456789012", NS, "ModelLatency",
                                           (("EndpointName", "ep"), ("VariantName", "v")),
                                           time.time() - 120, time.time() + 60, 60)
    finally:
        db.dispose()
    assert [(r.sample_count, r.sum) for r in rows] == [(1, pytest.approx(10000))]


RECORD_ONE = """
import sys
from eaglenest.api.observability import ApiMetrics, Invocation
from eaglenest.db.session import Database
from eaglenest.foundation.settings import Settings
settings = Settings(data_dir=sys.argv[1])
m = ApiMetrics.build(settings, Database(settings.resolved_database_url()), None)
m.invocation(Invocation("123456789012", "ep", "v", 1, 503, None, 0.0002))
"""


def test_multiprocess_mode_sums_every_process(tmp_path) -> None:
    from eaglenest.api.observability import ApiMetrics

    (tmp_path / "data").mkdir()
    settings, app = _app(tmp_path / "data")
    shared = tmp_path / "prometheus"
    shared.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(shared)}
    procs = [subprocess.Popen([sys.executable, "-c", RECORD_ONE, str(tmp_path / "data")],
                              env=env, cwd=ROOT) for _ in range(2)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    text = ApiMetrics.build(settings, app.state.ctx.db, None, str(shared)).render().decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    labels = {"account": "123456789012", "endpoint": "ep", "variant": "v"}
    fam = "eaglenest_endpoint_invocation_5xx_errors"
    assert value(fams, fam, fam + "_total", **labels) == 2
    fam = "eaglenest_endpoint_overhead_latency_microseconds"
    assert value(fams, fam, fam + "_count", **labels) == 2
    assert value(fams, "eaglenest_database_up", "eaglenest_database_up") == 1


def test_scrape_shows_the_stores_last_minute_with_an_account_label(tmp_path) -> None:
    """The worker-side namespaces, as their writers put them in the store (two samples in
    a minute: the gauge is their average); a namespace /metrics does not show stays out."""
    from starlette.testclient import TestClient

    settings, app = _app(tmp_path)
    now = time.time()
    ep = (("EndpointName", "ep"), ("VariantName", "v"))
    host = (("GPU", "0"), ("Host", "host-a"))
    db = Database(settings.resolved_database_url())
    try:
        with db.session() as s:
            metrics_repo.record(s, "123456789012", [
                metrics_repo.Datum("EagleNest/Endpoints", "AcceptedTokensPerRound", ep, v,
                                   "None", now) for v in (2.0, 3.0)], 100)
            metrics_repo.record(s, "123456789012", [metrics_repo.Datum(
                "/aws/sagemaker/Endpoints", "CPUUtilization", ep, 40.0, "Percent", now)], 100)
            metrics_repo.record(s, "", [metrics_repo.Datum(
                "EagleNest/Hosts", "GPUUtilization", host, 75.0, "Percent", now)], 100)
            metrics_repo.record(s, "123456789012", [metrics_repo.Datum(
                "Custom/Other", "Whatever", ep, 1.0, "None", now)], 100)
    finally:
        db.dispose()
    text = TestClient(app, client=("127.0.0.1", 50000)).get("/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    labels = {"account": "123456789012", "endpoint": "ep", "variant": "v"}
    fam = "eaglenest_endpoint_accepted_tokens_per_round"
    assert value(fams, fam, fam, **labels) == 2.5
    fam = "eaglenest_endpoint_cpu_utilization_percent"
    assert value(fams, fam, fam, **labels) == 40
    fam = "eaglenest_host_gpu_utilization_percent"
    assert value(fams, fam, fam, host="host-a", gpu="0") == 75
    assert "whatever" not in text.lower()


def test_without_a_token_only_loopback_clients_scrape(tmp_path) -> None:
    from starlette.testclient import TestClient

    _, app = _app(tmp_path)
    for host in ("127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"):
        r = TestClient(app, client=(host, 5000)).get("/metrics")
        assert r.status_code == 200 and "eaglenest_database_up 1.0" in r.text, host
    for host in ("10.0.0.7", "192.168.1.2", "::ffff:10.0.0.7", "2001:db8::1", "testclient"):
        r = TestClient(app, client=(host, 5000)).get("/metrics")
        assert (r.status_code, r.headers["content-type"]) == (403, "text/plain; charset=utf-8")
        assert r.text.startswith("/metrics answers loopback clients only while "
                                 "EAGLENEST_METRICS_TOKEN is unset"), host
        assert "eaglenest_" not in r.text


def test_with_a_token_only_its_bearer_scrapes(tmp_path) -> None:
    from starlette.testclient import TestClient

    token = "a" * 31 + "Z"
    _, app = _app(tmp_path, metrics_token=token)
    remote, local = (TestClient(app, client=(h, 5000)) for h in ("10.0.0.7", "127.0.0.1"))
    for client in (remote, local):  # loopback too needs the token once it is set
        r = client.get("/metrics")
        assert (r.status_code, r.headers["www-authenticate"]) == (401, "Bearer")
        assert "needs a bearer token: set EAGLENEST_METRICS_TOKEN" in r.text
        for wrong in (f"Bearer {token[:-1]}z", f"Bearer {token}x", f"Basic {token}"):
            r = client.get("/metrics", headers={"Authorization": wrong})
            assert r.status_code == 401 and "eaglenest_" not in r.text, wrong
        r = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and "eaglenest_database_up 1.0" in r.text
    assert "is not EAGLENEST_METRICS_TOKEN" in remote.get(
        "/metrics", headers={"Authorization": "Bearer nope"}).text
    # a malformed token: no API, and an error that names the variable, not the secret
    for bad in ("too short", f"{token} ", "é" * 20):
        with pytest.raises(ValueError, match="^EAGLENEST_METRICS_TOKEN must be at least 16 "
                           "characters of A-Z a-z 0-9") as exc:
            _app(tmp_path, metrics_token=bad)
        assert bad.strip() not in str(exc.value)
    assert str(exc.value).endswith("; it has 20, 20 of them other characters")


def cloudwatch_window(invoked: dict[str, Any]) -> dict[str, Any]:
    dims = [{"Name": "EndpointName", "Value": invoked["name"]},
            {"Name": "VariantName", "Value": VARIANT}]
    start = int(invoked["spans"][0][0] // 60) * 60 - 60
    return {"Namespace": NS, "Dimensions": dims, "Period": 60,
            "StartTime": datetime.fromtimestamp(start, UTC),
            "EndTime": datetime.fromtimestamp(time.time() + 120, UTC)}


def test_cloudwatch_reads_the_invocations_just_made(stack, invoked) -> None:
    """The issue's check with clients nobody here wrote: boto3's `cloudwatch` returns the
    invocations the sagemaker-runtime calls above made (sums and sample counts per minute
    equal what was sent), ModelLatency's p50/p99, nothing of them to another account's
    key; the AWS CLI prints the same sums."""
    window = cloudwatch_window(invoked)
    cw = stack.client("cloudwatch")

    def invocations() -> list[dict[str, Any]] | None:
        points = cw.get_metric_statistics(MetricName="Invocations", **window,
                                          Statistics=["Sum", "SampleCount"])["Datapoints"]
        return points if sum(p["Sum"] for p in points) == 6 else None

    points = wait_for(invocations, 15, "CloudWatch never showed the 6 invocations", stack)
    assert all(p["Sum"] == p["SampleCount"] and p["Unit"] == "Count" for p in points)
    if all(int(a // 60) == int(b // 60) for a, b in invoked["spans"]):
        want = Counter(int(b // 60) * 60 for _, b in invoked["spans"])
        assert {int(p["Timestamp"].timestamp()): p["Sum"] for p in points} == want
    latency = cw.get_metric_statistics(MetricName="ModelLatency", **window,
                                       ExtendedStatistics=["p50", "p99"])["Datapoints"]
    assert sum(1 for _ in latency) >= 1
    for p in latency:
        assert p["Unit"] == "Microseconds"
        assert 0 < p["ExtendedStatistics"]["p50"] <= p["ExtendedStatistics"]["p99"]
    other = stack.client("cloudwatch", **invoked["creds"])
    theirs = other.get_metric_statistics(MetricName="Invocations", **window,
                                         Statistics=["Sum"])["Datapoints"]
    assert sum(p["Sum"] for p in theirs) == 1  # their own call, none of these six
    listed = other.list_metrics(Namespace=NS, MetricName="Invocations")["Metrics"]
    assert all({"Name": "EndpointName", "Value": invoked["name"]} in m["Dimensions"]
               for m in listed)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
               AWS_DEFAULT_REGION=REGION, AWS_MAX_ATTEMPTS="1")
    dims = [f"Name={d['Name']},Value={d['Value']}" for d in window["Dimensions"]]
    r = subprocess.run(
        [str(Path(sys.executable).parent / "aws"), "cloudwatch", "get-metric-statistics",
         "--namespace", NS, "--metric-name", "Invocations", "--dimensions", *dims,
         "--start-time", window["StartTime"].isoformat(),
         "--end-time", window["EndTime"].isoformat(), "--period", "60",
         "--statistics", "Sum", "SampleCount", "--endpoint-url", stack.url,
         "--output", "json"], env=env, capture_output=True, text=True, timeout=120,
        check=False)
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout)["Datapoints"]
    assert sorted((p["Sum"], p["SampleCount"]) for p in printed) == sorted(
        (p["Sum"], p["SampleCount"]) for p in points)
