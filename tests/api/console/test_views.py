"""What the console's pages show (api/console/views.py, figures.py, charts.py), in a real
browser, from rows written the way the worker and the runtime proxy write them: a running
job's stage bars and training curve, a finished job's benchmark chart and schedule, an
endpoint's instances and last-hour charts from the metric store, a host's GPUs; the empty
state of every chart; a second account seeing none of it; markup in a tag value or a
failure reason shown as text. No worker runs here (the live job is tests/api/console/
test_live.py's)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.api.console.conftest import Key, create_key, page_cost, shot, sign_in
from tests.support.jobs import job
from tests.support.stack import ACCESS_KEY, ACCOUNT, SECRET_KEY, Stack

XSS = "<img src=x onerror=alert(1)>"
ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"
CURVE = [{"step": 1, "loss": 3.2, "train_acc": [0.10, 0.05, 0.02], "held_out_acc": None,
          "time": 1.0},
         {"step": 2, "loss": 2.6, "train_acc": [0.30, 0.15, 0.05],
          "held_out_acc": [0.20, 0.10, 0.04], "time": 2.0},
         {"step": 3, "loss": 2.1, "train_acc": [0.45, 0.25, 0.10], "held_out_acc": None,
          "time": 3.0}]
#: workers/jobs/bench_stage.py run_benchmark's report, the parts the console reads
#: (rows listed in the order measured; the table follows that list, not the dict's order)
BENCHMARK = {"backend": "embedded", "schedule": {
    "thresholds": [[1, 3, "tree"], [2, 0]], "backend": "embedded", "mode": "chain",
    "measured": {"concurrency": [1, 2, 4], "ks": [1, 3], "rounds": 2,
                 "rows": ["baseline", "chain K=1", "chain K=3", "tree K=3"],
                 "chosen": {"1": "tree K=3", "2": "off", "4": "off"},
                 "output_throughput": {
                     "tree K=3": {"1": 160.0, "2": 150.0, "4": 190.0},
                     "baseline": {"1": 100.0, "2": 180.0, "4": 300.0},
                     "chain K=1": {"1": 120.0, "2": 170.0, "4": 250.0},
                     "chain K=3": {"1": 150.5, "2": 160.0, "4": 200.0}}}}}


@contextmanager
def rows(stack: Stack) -> Iterator[Any]:
    from eaglenest.db.session import Database

    db = Database(stack.database_url)
    try:
        with db.session() as s:
            yield s
    finally:
        db.dispose()


def _job_row(s: Any, name: str, account: str = ACCOUNT) -> Any:
    from eaglenest.db.tables import OptimizationJobRow

    return s.query(OptimizationJobRow).filter_by(name=name, account_id=account).one()


@pytest.fixture(scope="module")
def seeded(api: Stack) -> Key:
    """A running job, a finished one, a fresh one, an endpoint with two instances on a GPU
    host and a minute of its metrics (account A); a job of account B holding a GPU of the
    same host. Returns B's key."""
    from eaglenest.db import metrics_repo
    from eaglenest.db.tables import EndpointRow, GpuHoldingRow, ModelRow, WorkerRow

    other = create_key(api, "console-views-b")
    sm = api.client()
    for name in ("views-running", "views-done", "views-fresh"):
        sm.create_optimization_job(OptimizationJobName=name, **job("s3://models/m/"))
    sm.create_model(ModelName="views-model", ExecutionRoleArn=ROLE, PrimaryContainer={
        "Image": "eaglenest", "ModelDataUrl": "s3://models/m/model.tar.gz"},
        Tags=[{"Key": "team", "Value": "search"}])
    sm.create_endpoint_config(EndpointConfigName="views-cfg", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "views-model",
        "InstanceType": "ml.g5.12xlarge", "InitialInstanceCount": 2}])
    sm.create_endpoint(EndpointName="views-ep", EndpointConfigName="views-cfg")
    other_sm = api.client(key=other.access_key, secret=other.secret)
    b_s3 = api.client("s3", key=other.access_key, secret=other.secret)
    for bucket in ("b-models", "b-output"):  # B's own buckets
        b_s3.create_bucket(Bucket=bucket)
    b_job = job("s3://b-models/m/")
    b_job["OutputConfig"]["S3OutputLocation"] = "s3://b-output/jobs/"
    other_sm.create_optimization_job(OptimizationJobName="b-secret-job", **b_job)
    now = time.time()
    with rows(api) as s:
        running = _job_row(s, "views-running")
        running.status, running.failure_reason = "INPROGRESS", None
        running.progress = {"stage": "train eagle3 head on 96 samples", "step": 2, "total": 4,
                            "loss": 2.6, "curve": CURVE, "updated": now}
        done = _job_row(s, "views-done")
        done.status, done.output = "COMPLETED", {"Benchmark": BENCHMARK}
        done.failure_reason = f"an earlier attempt said {XSS}"
        # SageMaker's tag pattern refuses markup (test below): the row gets it directly, as
        # a row written before that check, or by another writer, could hold it
        model = s.query(ModelRow).filter_by(name="views-model", account_id=ACCOUNT).one()
        model.tags = [{"Key": "team", "Value": "search"}, {"Key": "note", "Value": XSS}]
        done.tags = [{"Key": XSS, "Value": XSS}]
        ep = s.query(EndpointRow).filter_by(name="views-ep", account_id=ACCOUNT).one()
        ep.status = "InService"
        instances = [{"url": "http://10.0.0.5:9001", "pid": 4242, "secret": "not-shown-s3cret",
                      "unit": f"AllTraffic-0-{i}", "host": "gpu-host-a", "gpus": [i]}
                     for i in range(2)]
        ep.deployment = {"ProductionVariants": [{
            "VariantName": "AllTraffic", "CurrentWeight": 1.0, "DesiredWeight": 1.0,
            "CurrentInstanceCount": 2, "DesiredInstanceCount": 2}],
            "Servers": {"AllTraffic": {**instances[0], "instances": instances,
                                       "backend": "embedded"}}}
        s.add(WorkerRow(owner="gpu-host-a:1", host="gpu-host-a", machine="elsewhere",
                        boot="b", pid=1, pid_start=1, queues="train,serve",
                        gpus=[{"index": i, "name": "NVIDIA H100", "memory_gib": 80.0}
                              for i in range(4)], started_time=now, heartbeat_time=now + 600))
        other_job = _job_row(s, "b-secret-job", other.account)
        for i, (holder, unit) in enumerate([(ep.arn, "AllTraffic-0-0"),
                                            (ep.arn, "AllTraffic-0-1"),
                                            (other_job.arn, "job")]):
            s.add(GpuHoldingRow(host="gpu-host-a", gpu_index=i, holder=holder, unit=unit,
                                owner="gpu-host-a:1", since=now))
        dims = (("EndpointName", "views-ep"), ("VariantName", "AllTraffic"))
        data = [metrics_repo.Datum("AWS/SageMaker", "Invocations", dims, 1.0, "Count", now)
                for _ in range(7)]
        data += [metrics_repo.Datum("AWS/SageMaker", "ModelLatency", dims, v, "Microseconds",
                                    now) for v in (20_000.0, 40_000.0, 90_000.0)]
        data.append(metrics_repo.Datum("EagleNest/Endpoints", "AcceptedTokensPerRound", dims,
                                       2.5, "None", now))
        assert metrics_repo.record(s, ACCOUNT, data, 2000) == len(data)
    return other


@pytest.fixture(scope="module")
def page(api: Stack, browser: Any, seeded: Key) -> Iterator[Any]:
    p = sign_in(browser, api, ACCESS_KEY, SECRET_KEY)
    yield p
    p.context.close()


def _series(page: Any, chart: str) -> dict[str, int]:
    """Series name -> points drawn, of a chart on the page."""
    return page.eval_on_selector_all(
        f"#{chart} g.series", "gs => Object.fromEntries(gs.map(g => "
        "[g.dataset.series, g.querySelectorAll('circle').length]))")


def test_running_job_shows_stage_bars_and_curve(api: Stack, page: Any, artifacts) -> None:
    page.goto(api.url + "/console/jobs/views-running")
    bars = page.eval_on_selector_all(
        "#stages tr.stage", "rs => rs.map(r => [r.dataset.stage, "
        "r.querySelector('progress').value])")
    assert bars == [["download", 100], ["check", 100], ["load", 100], ["train", 50],
                    ["export", 0], ["upload", 0]]
    assert page.eval_on_selector("#job-progress", "e => e.value") == 61  # (5 + 2/4) of 9
    assert page.inner_text("#stage-detail") == "step 2/4, loss 2.600"
    assert _series(page, "chart-loss") == {"loss": 3}
    assert _series(page, "chart-accuracy") == {
        "train acc@1": 3, "train acc@2": 3, "train acc@3": 3,
        "held-out acc@1": 1, "held-out acc@2": 1, "held-out acc@3": 1}
    assert page.get_attribute("#live", "data-refresh") == "2"  # it is live
    assert page.is_visible("#stop-job")
    assert page.inner_text("#benchmark-none").startswith("No benchmark yet")
    shot(page, artifacts, "job-running-seeded")


def test_finished_job_shows_benchmark_and_schedule(api: Stack, page: Any, artifacts) -> None:
    page.goto(api.url + "/console/jobs/views-done")
    assert _series(page, "chart-benchmark") == {"baseline": 3, "chain K=1": 3, "chain K=3": 3,
                                                "tree K=3": 3}
    rings = page.eval_on_selector_all("#chart-benchmark circle.ring",
                                      "cs => cs.map(c => c.textContent)")
    assert rings == ["schedule at 1: tree K=3", "schedule at 2: baseline",
                     "schedule at 4: baseline"]
    table = page.eval_on_selector_all("#benchmark tbody tr", "rs => rs.map(r => "
                                      "[...r.cells].map(c => c.textContent))")
    assert table == [["1", "100.0", "120.0", "150.5", "160.0", "tree K=3"],
                     ["2", "180.0", "170.0", "160.0", "150.0", "off"],
                     ["4", "300.0", "250.0", "200.0", "190.0", "off"]]
    assert page.eval_on_selector_all(
        "#stages tr.stage", "rs => rs.map(r => [r.dataset.stage, "
        "r.querySelector('progress').value])") == [
        [k, 100] for k in ("download", "check", "load", "train", "export", "benchmark",
                           "upload")]
    assert page.inner_text("#schedule") == "tree K=3 at 1 running, off from 2"
    assert page.get_attribute("#live", "data-refresh") == "0"  # finished: not polled
    assert not page.is_visible("#stop-job")
    shot(page, artifacts, "job-finished-seeded")


def test_charts_without_data_say_so(api: Stack, page: Any) -> None:
    page.goto(api.url + "/console/jobs/views-fresh")
    assert page.eval_on_selector_all(".chart .empty", "es => es.map(e => e.textContent)") == \
        ["no data yet", "no data yet"]
    assert page.eval_on_selector("#job-progress", "e => e.value") == 0


def test_endpoint_shows_instances_and_metrics(api: Stack, page: Any, artifacts) -> None:
    page.goto(api.url + "/console/endpoints/views-ep")
    instances = page.eval_on_selector_all("#instances tbody tr", "rs => rs.map(r => "
                                          "[...r.cells].map(c => c.textContent))")
    assert instances == [["AllTraffic", "1", "gpu-host-a", "0", "AllTraffic-0-0", "4242"],
                         ["AllTraffic", "2", "gpu-host-a", "1", "AllTraffic-0-1", "4242"]]
    assert "not-shown-s3cret" not in page.content()  # the instance secret is never shown
    assert page.inner_text("#invocations-total") == "7"
    assert _series(page, "chart-invocations") == {"AllTraffic": 1}
    assert _series(page, "chart-latency") == {"AllTraffic p50": 1, "AllTraffic p99": 1}
    assert _series(page, "chart-tau") == {"AllTraffic": 1}
    title = page.eval_on_selector("#chart-tau g.series circle", "c => c.textContent")
    assert title.endswith("-> 2.5")
    shot(page, artifacts, "endpoint-seeded")


def test_hosts_show_gpus_without_other_accounts_names(api: Stack, page: Any,
                                                      artifacts) -> None:
    page.goto(api.url + "/console/hosts")
    gpus = page.eval_on_selector_all("section[data-host='gpu-host-a'] tbody tr", "rs => "
                                     "rs.map(r => [...r.cells].slice(0, 5).map(c => "
                                     "c.textContent))")
    assert gpus == [["0", "NVIDIA H100", "80.0 GiB", "endpoint views-ep", "AllTraffic-0-0"],
                    ["1", "NVIDIA H100", "80.0 GiB", "endpoint views-ep", "AllTraffic-0-1"],
                    ["2", "NVIDIA H100", "80.0 GiB", "another account", "-"],
                    ["3", "NVIDIA H100", "80.0 GiB", "free", "-"]]
    assert "b-secret-job" not in page.content()
    shot(page, artifacts, "hosts")


def test_markup_in_tags_and_reasons_is_shown_as_text(api: Stack, page: Any,
                                                     artifacts) -> None:
    from botocore.exceptions import ClientError

    dialogs: list[str] = []

    def dialog(d: Any) -> None:
        dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", dialog)
    sm = api.client()
    arn = sm.describe_optimization_job(OptimizationJobName="views-done")["OptimizationJobArn"]
    with pytest.raises(ClientError) as refused:  # the API keeps markup out of tags
        sm.add_tags(ResourceArn=arn, Tags=[{"Key": "note", "Value": XSS}])
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    for path in ("/console/models", "/console/jobs", "/console/jobs/views-done"):
        page.goto(api.url + path)
        assert XSS in page.inner_text("main"), path
        assert page.query_selector_all("main img") == [], path
    assert page.inner_text("#failure") == f"an earlier attempt said {XSS}"
    page.goto(api.url + "/console/models")
    shot(page, artifacts, "models")
    page.wait_for_selector("body[data-refreshed]", state="attached", timeout=15_000)  # swapped
    assert XSS in page.inner_text("main") and page.query_selector_all("main img") == []
    assert dialogs == []


def test_another_account_sees_none_of_it(api: Stack, browser: Any, seeded: Key,
                                         artifacts) -> None:
    page = sign_in(browser, api, seeded.access_key, seeded.secret)
    assert page.inner_text("#account") == seeded.account
    assert [r.inner_text() for r in page.query_selector_all("#jobs td.name")] == ["b-secret-job"]
    for path in ("/console/models", "/console/endpoints"):
        page.goto(api.url + path)
        assert page.is_visible("#none"), path
    missing = page.goto(api.url + "/console/jobs/no-such-job")
    assert missing.status == 404
    not_found = missing.text()
    for path in ("/console/jobs/views-running", "/console/endpoints/views-ep",
                 "/console/endpoints/views-ep/delete"):
        answer = page.goto(api.url + path)
        assert answer.status == 404 and answer.text() == not_found, path
    shot(page, artifacts, "not-found")
    page.goto(api.url + "/console/hosts")
    assert "views-ep" not in page.content()
    assert page.eval_on_selector_all("section[data-host='gpu-host-a'] tbody tr", "rs => "
                                     "rs.map(r => r.cells[3].textContent)") == [
        "another account", "another account", "job b-secret-job", "free"]
    page.context.close()


def test_page_view_cost(api: Stack, page: Any, artifacts) -> None:
    """What a view of each page costs the API, with these rows (the live stack's figures:
    tests/api/console/test_live.py)."""
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    cost = page_cost(api.url, cookies, [
        "/console/models", "/console/jobs", "/console/jobs/views-running",
        "/console/jobs/views-done", "/console/endpoints", "/console/endpoints/views-ep",
        "/console/hosts"], artifacts / "console-cost-seeded.json")
    print(json.dumps(cost, indent=1))
    assert all(v["p50_ms"] < 1000 for v in cost.values()), cost
