"""The console against a real stack (API, Celery worker, embedded Redis) running one real
optimization job on the tiny target, in a real browser: the job's progress bar advancing
through its stages as the page refreshes itself, its training curve and benchmark chart,
its output model served as an endpoint whose invocation count rises after boto3 calls, a
second account seeing none of it, a cross-site POST refused, stopping a job and deleting
an endpoint (confirmed) from the console, signing out; and what a page view costs the API.
One stack and one job for the module; the tests run in this order."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.console.conftest import Key, create_key, page_cost, shot, sign_in
from tests.support.jobs import job, upload, wait_status
from tests.support.stack import ACCESS_KEY, SECRET_KEY, Stack, wait_endpoint

JOB, STOPPED_JOB, MODEL, CONFIG, ENDPOINT = ("console-job", "console-stop", "console-optimized",
                                             "console-cfg", "console-ep")
ORDER = ["download", "check", "load", "regenerate", "capture", "train", "export", "benchmark",
         "upload"]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[Stack]:
    """The stack, with the job created at once (it runs while the browser starts)."""
    s = Stack(tmp_path_factory.mktemp("console-live")).start()
    upload(s, tiny_llama_dir, "s3://models/tiny-llama/")
    s.client().create_optimization_job(
        OptimizationJobName=JOB, **job("s3://models/tiny-llama/", MODEL,
                                       EAGLENEST_PROGRESS_EVERY="1"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def page(live: Stack, browser: Any) -> Iterator[Any]:
    p = sign_in(browser, live, ACCESS_KEY, SECRET_KEY)
    yield p
    p.context.close()


@pytest.fixture(scope="module")
def other(live: Stack) -> Key:
    return create_key(live, "console-other")


def _watch(page: Any) -> dict[str, Any] | None:
    """The job page's figures as the browser shows them now."""
    return page.eval_on_selector("#live", """m => {
        const bar = m.querySelector('#job-progress');
        const running = m.querySelector('#stages tr.st-running');
        return bar && {value: bar.value, status: m.querySelector('h1 .status').textContent,
                       stage: running ? running.dataset.stage : null};
    }""")


def _series(page: Any, chart: str) -> dict[str, int]:
    return page.eval_on_selector_all(
        f"#{chart} g.series", "gs => Object.fromEntries(gs.map(g => "
        "[g.dataset.series, g.querySelectorAll('circle').length]))")


def test_job_moves_through_its_stages_live(live: Stack, page: Any, artifacts: Path) -> None:
    page.goto(f"{live.url}/console/jobs/{JOB}")
    values: list[int] = []
    stages: list[str] = []
    deadline = time.monotonic() + 420
    seen: dict[str, Any] | None = None
    shown = False
    while time.monotonic() < deadline:  # the page refreshes itself: never reloaded here
        seen = _watch(page)
        if seen:
            if not values or seen["value"] != values[-1]:
                values.append(seen["value"])
            if not shown and seen["stage"] in ("train", "export", "benchmark") and \
                    page.query_selector("#chart-loss g.series"):  # a point of the curve
                shown = bool(shot(page, artifacts, "job-running"))
            if seen["stage"] and (not stages or stages[-1] != seen["stage"]):
                stages.append(seen["stage"])
            if seen["status"] in ("COMPLETED", "FAILED", "STOPPED"):
                break
        time.sleep(0.25)
    assert seen and seen["status"] == "COMPLETED", (seen, values, live.log()[-3000:])
    assert page.get_attribute("body", "data-refreshed")  # live swaps, no reload
    assert values == sorted(values) and len(values) >= 3 and values[-1] == 100, values
    assert len(stages) >= 2 and stages == sorted(stages, key=ORDER.index), stages
    assert {"train", "benchmark"} & set(stages), stages
    assert page.eval_on_selector_all("#stages progress", "ps => ps.map(p => p.value)") == \
        [100] * len(page.query_selector_all("#stages tr.stage"))


def test_finished_job_shows_curve_and_benchmark(live: Stack, page: Any, artifacts: Path
                                                ) -> None:
    page.goto(f"{live.url}/console/jobs/{JOB}")
    assert _series(page, "chart-loss") == {"loss": 4}  # a point per step (4 steps)
    accuracy = _series(page, "chart-accuracy")
    assert accuracy["train acc@1"] == 4, accuracy
    assert _series(page, "chart-benchmark") == {"baseline": 2, "chain K=3": 2}
    assert len(page.query_selector_all("#chart-benchmark circle.ring")) == 2
    table = page.eval_on_selector_all("#benchmark tbody tr", "rs => rs.map(r => "
                                      "[...r.cells].map(c => c.textContent))")
    assert [r[0] for r in table] == ["1", "2"] and all(float(r[1]) > 0 for r in table)
    assert page.inner_text("#schedule")
    shot(page, artifacts, "job")
    page.goto(f"{live.url}/console/jobs")
    assert page.inner_text("#jobs td.name") == JOB
    shot(page, artifacts, "jobs")


def test_endpoint_invocations_rise(live: Stack, page: Any, artifacts: Path) -> None:
    sm, rt = live.client(), live.client("sagemaker-runtime")
    sm.create_endpoint_config(EndpointConfigName=CONFIG, ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": MODEL, "InstanceType": "ml.g5.2xlarge",
        "InitialInstanceCount": 1, "ContainerStartupHealthCheckTimeoutInSeconds": 120}])
    sm.create_endpoint(EndpointName=ENDPOINT, EndpointConfigName=CONFIG)
    wait_endpoint(sm, ENDPOINT, {"InService", "Failed"}, 240, live)
    page.goto(f"{live.url}/console/endpoints/{ENDPOINT}")
    instance = live.deployment(ENDPOINT)["Servers"]["AllTraffic"]["instances"][0]
    cells = page.eval_on_selector("#instances tbody tr", "r => [...r.cells].map(c => "
                                  "c.textContent)")
    assert instance.get("host") and not instance.get("gpus"), instance  # this host, no GPU
    assert cells[:4] == ["AllTraffic", "1", instance["host"], "none (CPU)"], cells
    before = int(page.inner_text("#invocations-total"))
    for text in ("Natalia sold 48 clips", "hello", "2 + 2 ="):
        rt.invoke_endpoint(EndpointName=ENDPOINT, ContentType="application/json",
                           Body=json.dumps({"inputs": text,
                                            "parameters": {"max_new_tokens": 4}}))
    deadline = time.monotonic() + 60
    while int(page.inner_text("#invocations-total")) < before + 3:  # the page refreshes
        assert time.monotonic() < deadline, page.inner_text("#invocations-total")
        time.sleep(0.5)
    assert int(page.inner_text("#invocations-total")) == before + 3
    assert _series(page, "chart-invocations") == {"AllTraffic": 1}
    assert set(_series(page, "chart-latency")) == {"AllTraffic p50", "AllTraffic p99"}
    shot(page, artifacts, "endpoint")
    page.goto(f"{live.url}/console/endpoints")
    shot(page, artifacts, "endpoints")


def test_another_account_sees_none_of_it(live: Stack, browser: Any, other: Key) -> None:
    b = sign_in(browser, live, other.access_key, other.secret)
    for path in ("/console/jobs", "/console/models", "/console/endpoints"):
        b.goto(live.url + path)
        assert b.is_visible("#none"), path
    missing = b.goto(f"{live.url}/console/jobs/no-such-job")
    assert missing.status == 404
    not_found = missing.text()
    for path in (f"/console/jobs/{JOB}", f"/console/endpoints/{ENDPOINT}",
                 f"/console/endpoints/{ENDPOINT}/delete"):
        answer = b.goto(live.url + path)
        assert answer.status == 404 and answer.text() == not_found, path
    b.goto(live.url + "/console/hosts")
    assert JOB not in b.content() and ENDPOINT not in b.content()
    csrf = b.eval_on_selector("input[name=csrf]", "i => i.value")
    answer = b.context.request.post(f"{live.url}/console/endpoints/{ENDPOINT}/delete",
                                    form={"csrf": csrf}, headers={"origin": live.url})
    assert answer.status == 404  # B's own valid token: still not B's endpoint
    assert live.client().describe_endpoint(EndpointName=ENDPOINT)["EndpointStatus"] == \
        "InService"
    b.context.close()


class _Evil(BaseHTTPRequestHandler):
    target = ""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = (f'<form id="f" method="post" action="{self.target}"><input type="hidden" '
                'name="confirm" value="1"></form><script>document.getElementById("f")'
                ".submit()</script>").encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_cross_site_post_is_refused(live: Stack, page: Any) -> None:
    """A page of another origin (another port of this host: same site, so the SameSite
    cookie goes along) posts the delete form without the token: refused, nothing changes.
    So is a POST with the session but no token, and one naming another Origin."""
    _Evil.target = f"{live.url}/console/endpoints/{ENDPOINT}/delete"
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Evil)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with page.expect_response(lambda r: r.url == _Evil.target) as answer:
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        assert answer.value.status == 403
        assert "did not come from a page of this console" in page.inner_text("#refused")
    finally:
        server.shutdown()
        server.server_close()
    page.goto(f"{live.url}/console/endpoints/{ENDPOINT}/delete")
    csrf = page.eval_on_selector("input[name=csrf]", "i => i.value")
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    with httpx.Client(base_url=live.url, cookies=cookies) as c:
        assert c.post(_Evil.target, data={"confirm": "1"}).status_code == 403
        assert c.post(_Evil.target, data={"csrf": csrf},
                      headers={"origin": "http://evil.example"}).status_code == 403
    assert live.client().describe_endpoint(EndpointName=ENDPOINT)["EndpointStatus"] == \
        "InService"


def test_page_view_cost(live: Stack, page: Any, artifacts: Path) -> None:
    """What a page view costs the API with a real job's rows and a served endpoint."""
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    cost = page_cost(live.url, cookies, [
        "/console/models", "/console/jobs", f"/console/jobs/{JOB}", "/console/endpoints",
        f"/console/endpoints/{ENDPOINT}", "/console/hosts"], artifacts / "console-cost-live.json")
    print(json.dumps(cost, indent=1))
    assert all(v["p50_ms"] < 1000 for v in cost.values()), cost


def test_stop_a_job_from_the_console(live: Stack, page: Any) -> None:
    sm = live.client()
    sm.create_optimization_job(OptimizationJobName=STOPPED_JOB,
                               **job("s3://models/tiny-llama/"))
    page.goto(f"{live.url}/console/jobs/{STOPPED_JOB}")
    with page.expect_navigation():
        page.click("#stop-job")
    assert page.url == f"{live.url}/console/jobs/{STOPPED_JOB}"
    status = sm.describe_optimization_job(OptimizationJobName=STOPPED_JOB)
    assert status["OptimizationJobStatus"] in ("STOPPING", "STOPPED")
    assert page.inner_text("#live h1 .status") in ("STOPPING", "STOPPED")
    assert wait_status(sm, STOPPED_JOB, {"STOPPED", "FAILED", "COMPLETED"}, 120, live)[
        "OptimizationJobStatus"] == "STOPPED"


def test_delete_an_endpoint_after_confirming(live: Stack, page: Any, artifacts: Path) -> None:
    page.goto(f"{live.url}/console/endpoints/{ENDPOINT}")
    with page.expect_navigation():
        page.click("#delete-endpoint")
    assert page.url == f"{live.url}/console/endpoints/{ENDPOINT}/delete"
    shot(page, artifacts, "endpoint-delete-confirm")
    sm = live.client()
    assert sm.describe_endpoint(EndpointName=ENDPOINT)["EndpointStatus"] == "InService"
    with page.expect_navigation():
        page.click("#confirm-delete")
    assert page.url == f"{live.url}/console/endpoints"
    sm.get_waiter("endpoint_deleted").wait(EndpointName=ENDPOINT,
                                           WaiterConfig={"Delay": 1, "MaxAttempts": 90})


def test_sign_out(live: Stack, page: Any) -> None:
    with page.expect_navigation():
        page.click("#sign-out")
    assert page.url == f"{live.url}/console/login"
    page.goto(f"{live.url}/console/jobs")
    assert "/console/login" in page.url
