"""Prometheus on the docker compose stack, and the Grafana dashboard's queries (issue #54).

Run by scripts/compose_check.sh after tests/docker/compose_drive.py, which left the endpoint
`compose-ep` (variant AllTraffic, the job's output model tiny-eagle) in service; with the
test venv:

    python tests/docker/compose_prometheus.py

compose-ep serves the target alone: the job's benchmark of its barely trained head chose
K = 0 at every load (EAGLENEST_SPECULATION_SCHEDULE in tiny-eagle's Environment), so it has
no tau. The dashboard is therefore read on a second endpoint, `compose-k3`: tiny-eagle's
container with a fixed K = 3 (`SPECULATING`), deployed while steps 1 and 2 run (its
first invocation before step 2's wait for a scrape). In order,
against the real Prometheus (docker-compose.yml `prometheus`) over its HTTP API:
  1. its target for the job `eaglenest` (the API's /metrics) is `health == "up"`: it
     scrapes with the bearer token EAGLENEST_METRICS_TOKEN, which the service's entrypoint
     wrote to a file only Prometheus's user can read (mode 400, checked in the container);
  2. after more invocations of compose-ep, Prometheus's invocation count of the endpoint
     equals the API's own /metrics (so it scraped the stack as it is now);
  3. every panel query of docker/grafana/dashboards/eaglenest.json, its template variables
     (`$account`, `$endpoint`, `$variant`) set to compose-k3's labels and Grafana's
     `$__rate_interval` to 1m, answers at least one series with finite values (tau
     included: compose-k3 drafts), except the panels in EXPECTED_EMPTY, which must answer
     none; each template variable's values include compose-k3's. The store's gauges (tau,
     tokens/s, CPU) come from the workers' samples (EAGLENEST_METRICS_SAMPLE_SECONDS, 10 s
     in the compose check), so the queries are polled, invoking compose-k3 meanwhile, until
     they answer or 90 s pass.
With EAGLENEST_ARTIFACTS set, screenshots of Prometheus's pages go to its prometheus/
folder (`screenshots`). Exits non-zero (an AssertionError naming the panel, or a
TimeoutError) on the first failure. The dashboard's helpers (`panel_queries`,
`variable_queries`, `substitute`, `series_named`) serve tests/docker/test_dashboard.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "eaglenest.json"
PROMETHEUS = os.environ.get("COMPOSE_CHECK_PROMETHEUS", "http://127.0.0.1:9090")
API = os.environ.get("COMPOSE_CHECK_API", "http://127.0.0.1:8080")
ENDPOINT, VARIANT = "compose-ep", "AllTraffic"  # compose_drive.py's, left in service
#: the endpoint the dashboard is read on, and its model's Environment over tiny-eagle's
SPECULATING = "compose-k3"
FIXED_K = {"EAGLENEST_SPECULATION_SCHEDULE": "none", "EAGLENEST_NUM_SPECULATIVE_TOKENS": "3"}
#: Grafana's $__rate_interval for a 15 s scrape interval: max(4 x scrape, interval + scrape)
RATE_INTERVAL = "1m"
#: a variable set to All: Grafana puts the variable's allValue in as it is, unescaped
ALL = ".*"
#: series a panel shows that the CPU stack cannot have, and why
EXPECTED_EMPTY = {
    "eaglenest_endpoint_gpu_utilization_percent": "no GPU: NVML reads none",
    "eaglenest_endpoint_gpu_memory_utilization_percent": "no GPU: NVML reads none",
    "eaglenest_host_gpu_utilization_percent": "no GPU: NVML reads none",
    "eaglenest_host_gpu_memory_utilization_percent": "no GPU: NVML reads none",
}
FAMILY = re.compile(r"\beaglenest_[a-z0-9_]+")
START = time.monotonic()


def say(msg: str) -> None:
    print(f"[prometheus {time.monotonic() - START:5.1f}s] {msg}", flush=True)


@dataclass(frozen=True)
class Query:
    """One target of one dashboard panel."""

    panel: str
    ref: str
    expr: str

    @property
    def series(self) -> set[str]:
        return series_named(self.expr)


def series_named(text: str) -> set[str]:
    """The eaglenest series names in a PromQL expression (or a page of them), as /metrics
    writes them: `rate(eaglenest_x_total[1m])` -> {"eaglenest_x_total"}."""
    return set(FAMILY.findall(text))


def panel_queries(path: Path = DASHBOARD) -> list[Query]:
    """Every panel target of the dashboard (rows hold no queries)."""
    board = json.loads(path.read_text())
    return [Query(p["title"], t["refId"], t["expr"]) for p in board["panels"]
            for t in p.get("targets", [])]


def variable_queries(path: Path = DASHBOARD) -> dict[str, str]:
    """Template variable -> its query, `label_values(<selector>, <label>)`."""
    board = json.loads(path.read_text())
    return {v["name"]: v["query"]["query"] for v in board["templating"]["list"]}


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's variables in `expr` set as Grafana sets them in a `=~` matcher: the value's
    regex characters escaped by a backslash written twice inside the PromQL string
    (`a.b` -> `a\\\\.b`; `-` stays; ALL as it is), and `$__rate_interval` -> RATE_INTERVAL.
    A `$` left over is an unknown variable."""
    out = expr.replace("$__rate_interval", RATE_INTERVAL)
    for name, value in values.items():
        quoted = value if value == ALL else re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", value)
        out = out.replace(f"${name}", quoted)
    assert "$" not in out, f"a variable is not set in {out}"
    return out


def prometheus(path: str, **params: str) -> Any:
    import httpx

    r = httpx.get(f"{PROMETHEUS}{path}", params=params, timeout=30)
    assert r.status_code == 200, f"{path} {params}: {r.status_code} {r.text[:500]}"
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]


def api_invocations() -> tuple[str, float]:
    """compose-ep's account and its invocation count, from the API's own /metrics."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    token = os.environ["EAGLENEST_METRICS_TOKEN"]  # compose_check.sh's
    text = httpx.get(f"{API}/metrics", headers={"Authorization": f"Bearer {token}"},
                     timeout=30).text
    for family in text_string_to_metric_families(text):
        if family.name == "eaglenest_endpoint_invocations":
            for s in family.samples:
                if s.name.endswith("_total") and s.labels.get("endpoint") == ENDPOINT:
                    return s.labels["account"], s.value
    raise AssertionError(f"the API's /metrics has no invocations of {ENDPOINT}")


def check_token_file() -> None:
    """The token file the entrypoint wrote: mode 400, owned by the user Prometheus runs as
    (`nobody` upstream, `prometheus` in CI's Debian image), holding the API's token."""
    import subprocess

    (name,) = subprocess.run(["docker", "ps", "--format", "{{.Names}}", "--filter",
                              "label=com.docker.compose.service=prometheus"],
                             capture_output=True, text=True, check=True).stdout.split()
    out = subprocess.run(["docker", "exec", name, "sh", "-c",
                          "stat -c '%a %U' /etc/prometheus/metrics-token && id -un && "
                          "cat /etc/prometheus/metrics-token"],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    mode, user, token = out[0], out[1], "\n".join(out[2:])
    assert mode == f"400 {user}", (mode, user)
    assert token == os.environ["EAGLENEST_METRICS_TOKEN"], "the token file is not the API's"
    say(f"/etc/prometheus/metrics-token: mode 400, owned by {user}, the API's token")


def check_target() -> None:
    def up() -> dict[str, Any] | None:
        for t in prometheus("/api/v1/targets", state="active")["activeTargets"]:
            if t["labels"].get("job") == "eaglenest" and t["health"] == "up":
                return t  # type: ignore[no-any-return]
        return None

    target = poll("the eaglenest target to be up", up, 60)
    say(f"target {target['scrapeUrl']}: health {target['health']}, last scrape "
        f"{target['lastScrapeDuration'] * 1000:.0f} ms, error {target['lastError']!r}")


def poll(what: str, check: Any, timeout: float, between: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        if between is not None:
            between()
        time.sleep(1)


def series(expr: str) -> list[float]:
    return [float(r["value"][1]) for r in prometheus("/api/v1/query", query=expr)["result"]]


def expected_empty(q: Query) -> str:
    """Why `q` answers no series on this stack ("" when it must answer some)."""
    return next((EXPECTED_EMPTY[f] for f in sorted(q.series) if f in EXPECTED_EMPTY), "")


def check_panels(values: dict[str, str], invoke: Any) -> None:
    queries = panel_queries()
    for q in queries:
        assert q.series, f"panel {q.panel!r} {q.ref} reads no eaglenest family"
    pending = list(queries)
    answered: list[tuple[Query, list[float]]] = []

    def all_answered() -> bool:
        for q in list(pending):
            got = series(substitute(q.expr, values))
            if expected_empty(q):
                assert not got, f"panel {q.panel!r} {q.ref}: expected empty, got {got}"
            elif not got or not all(math.isfinite(v) for v in got):
                continue
            answered.append((q, got))
            pending.remove(q)
        return not pending

    try:
        poll("every panel query to answer", all_answered, 90, invoke)
    except TimeoutError:
        raise AssertionError("no finite series for " + "; ".join(
            f"{q.panel!r} {q.ref}: {series(substitute(q.expr, values))}"
            for q in pending)) from None
    for q, got in answered:
        shown = (f"{len(got)} series, first {got[0]:.4g}" if got else
                 f"empty as expected ({expected_empty(q)})")
        say(f"  {q.panel} [{q.ref}]: {shown}")


def check_variables(values: dict[str, str]) -> None:
    """`label_values(<selector>, <label>)`, as Grafana asks it: /api/v1/label/.../values."""
    for name, query in variable_queries().items():
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert m, f"variable {name}: {query}"
        selector, label = substitute(m.group(1), values), m.group(2)
        got = prometheus(f"/api/v1/label/{label}/values", **{"match[]": selector})
        assert values[name] in got, f"variable {name}: {values[name]} not in {got}"
    say(f"template variables {sorted(values)} list {values['endpoint']}'s labels")


def screenshots(folder: Path, values: dict[str, str]) -> None:
    """Prometheus's targets page, graphs of every endpoint's invocations and ModelLatency
    p99 (the dashboard's queries, endpoints All) and the console template
    (docker/prometheus/consoles/eaglenest.html), as Debian's chromium shows them
    (Playwright, as tests/api/console/), into `folder`. The UI's own prefix is where `/`
    sends the browser (/classic/graph on Debian's package, /graph upstream)."""
    from urllib.parse import urlencode

    from playwright.sync_api import sync_playwright

    queries = {(q.panel, q.ref): q.expr for q in panel_queries()}
    graph: dict[str, str] = {}
    for i, key in enumerate([("Invocations", "A"), ("ModelLatency p50 / p99", "B")]):
        graph.update({f"g{i}.expr": substitute(queries[key], {**values, "endpoint": ALL}),
                      f"g{i}.tab": "0", f"g{i}.range_input": "5m"})
    folder.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(PROMETHEUS + "/")
        prefix = page.url[len(PROMETHEUS):].rsplit("/graph", 1)[0]
        for name, path in (("targets", f"{prefix}/targets"),
                           ("graph", f"{prefix}/graph?{urlencode(graph)}"),
                           ("console", "/consoles/eaglenest.html")):
            page.goto(PROMETHEUS + path, wait_until="networkidle")
            if name == "graph":  # the charts are drawn after the queries answer
                page.wait_for_selector("svg", timeout=30000)
            page.screenshot(path=str(folder / f"prometheus-{name}.png"), full_page=True)
        browser.close()
    say(f"screenshots of the targets, a graph and the console page in {folder}")


def deploy_speculating(sm: Any) -> None:
    """compose-k3: tiny-eagle's container (the head as its eagle_model channel) with FIXED_K
    over its Environment; CreateEndpoint only (InService is awaited later)."""
    container = sm.describe_model(ModelName="tiny-eagle")["PrimaryContainer"]
    container["Environment"] = {**container.get("Environment", {}), **FIXED_K}
    sm.create_model(ModelName=SPECULATING, PrimaryContainer=container,
                    ExecutionRoleArn="arn:aws:iam::000000000000:role/EagleNest")
    sm.create_endpoint_config(EndpointConfigName=SPECULATING, ProductionVariants=[{
        "VariantName": VARIANT, "ModelName": SPECULATING, "InstanceType": "ml.g5.2xlarge",
        "InitialInstanceCount": 1}])
    sm.create_endpoint(EndpointName=SPECULATING, EndpointConfigName=SPECULATING)


def main() -> int:
    sys.path.insert(0, str(ROOT))  # run as a script: tests/ is not on the path
    from tests.docker.compose_drive import clients, invoke

    sm, rt, _ = clients()
    deploy_speculating(sm)
    check_token_file()
    check_target()
    for _ in range(5):
        invoke(rt, ENDPOINT)
    # compose-k3's first invocation before the count's wait for a scrape: its series then
    # need one scrape less afterwards
    status = poll(f"{SPECULATING} to leave Creating", lambda: (
        s := sm.describe_endpoint(EndpointName=SPECULATING))["EndpointStatus"] != "Creating"
        and s, 300)
    assert status["EndpointStatus"] == "InService", status.get("FailureReason")
    say(f"{SPECULATING} (tiny-eagle at K = 3): InService; {invoke(rt, SPECULATING)!r}")
    account, count = api_invocations()
    got = poll(f"Prometheus to count {count:.0f} invocations of {ENDPOINT}", lambda: (
        (v := series(f'sum(eaglenest_endpoint_invocations_total{{endpoint="{ENDPOINT}"}})'))
        and v[0] == count and v), 60, lambda: invoke(rt, SPECULATING))
    say(f"Prometheus counts {got[0]:.0f} invocations of {ENDPOINT}, as the API's /metrics")
    values = {"account": account, "endpoint": SPECULATING, "variant": VARIANT}
    check_panels(values, lambda: invoke(rt, SPECULATING))
    check_variables(values)
    say("the target is up and every dashboard query answers")
    if os.environ.get("EAGLENEST_ARTIFACTS"):  # CI artifacts and docs/images: opt-in
        screenshots(Path(os.environ["EAGLENEST_ARTIFACTS"]) / "prometheus", values)
    return 0


if __name__ == "__main__":
    sys.exit(main())
