"""The Prometheus and Grafana files of the compose stack, checked without docker (default
suite): every series the Grafana dashboard (docker/grafana/dashboards/eaglenest.json) and
the Prometheus console (docker/prometheus/consoles/eaglenest.html) query is one the API's
/metrics really writes, and the files agree with each other and with docker-compose.yml.

The series names come from a real scrape of an API app (api/observability.py) after one
invocation and the store data the workers write (their names from the workers' own
functions where those are pure). scripts/compose_check.sh runs the queries themselves
against the stack's Prometheus (tests/docker/compose_prometheus.py).
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from eaglenest.db import metrics_repo
from eaglenest.db.session import Database
from tests.docker.compose_prometheus import (
    ALL,
    DASHBOARD,
    EXPECTED_EMPTY,
    RATE_INTERVAL,
    panel_queries,
    series_named,
    substitute,
    variable_queries,
)

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
SCRAPE = yaml.safe_load((ROOT / "docker/prometheus/prometheus.yml").read_text())
DATASOURCES = yaml.safe_load(
    (ROOT / "docker/grafana/provisioning/datasources/prometheus.yml").read_text())
PROVIDERS = yaml.safe_load(
    (ROOT / "docker/grafana/provisioning/dashboards/eaglenest.yml").read_text())
CONSOLE = (ROOT / "docker/prometheus/consoles/eaglenest.html").read_text()
ACCOUNT = "123456789012"


def store_data(now: float) -> list[tuple[str, metrics_repo.Datum]]:
    """(account, datum) as the workers write them: the model servers' figures from
    workers/serving/endpoint_metrics.py `server_figures`, an instance's and a host's
    resources (GPU ones too: this store has no NVML to ask)."""
    from eaglenest.workers.serving.endpoint_metrics import Counters, server_figures

    ep = (("EndpointName", "ep"), ("VariantName", "v"))
    host = (("Host", "h"),)
    gpu = (("GPU", "0"), ("Host", "h"))
    before = Counters(at=now - 60)
    after = Counters(at=now, generation=40, drafts=10, draft_tokens=30, accepted=20)
    out = [(ACCOUNT, metrics_repo.Datum("EagleNest/Endpoints", name, ep, value, unit, now))
           for name, value, unit in server_figures(before, after, 3.0)]
    out += [(ACCOUNT, metrics_repo.Datum("/aws/sagemaker/Endpoints", name, ep, 50.0,
                                         "Percent", now))
            for name in ("CPUUtilization", "MemoryUtilization", "GPUUtilization",
                         "GPUMemoryUtilization")]
    out += [("", metrics_repo.Datum("EagleNest/Hosts", "CPUUtilization", host, 20.0,
                                    "Percent", now))]
    out += [("", metrics_repo.Datum("EagleNest/Hosts", name, gpu, 70.0, "Percent", now))
            for name in ("GPUUtilization", "GPUMemoryUtilization")]
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every series name of one /metrics scrape of a real API app (and the gauges' names:
    the hosts' GPU counts have no sample while no worker runs)."""
    from prometheus_client.parser import text_string_to_metric_families
    from starlette.testclient import TestClient

    from eaglenest.api.app import create_app
    from eaglenest.api.observability import Invocation
    from eaglenest.db.migrate import upgrade_head
    from eaglenest.foundation.settings import Settings

    settings = Settings(data_dir=tmp_path_factory.mktemp("api"), region="us-east-1")
    upgrade_head(settings.resolved_database_url())
    app = create_app(settings, "redis://127.0.0.1:1/0")
    db = Database(settings.resolved_database_url())
    try:
        with db.session() as s:
            for account, datum in store_data(time.time()):
                metrics_repo.record(s, account, [datum], 100)
    finally:
        db.dispose()
    with TestClient(app, client=("127.0.0.1", 50000)) as client:  # no token: loopback
        app.state.metrics.invocation(Invocation(ACCOUNT, "ep", "v", 1, 200, 0.01, 0.0001))
        text = client.get("/metrics").text
    families = list(text_string_to_metric_families(text))
    return ({s.name for f in families for s in f.samples}
            | {f.name for f in families if f.type == "gauge"})


def test_every_query_reads_series_the_api_exports(exported: set[str]) -> None:
    queries = panel_queries()
    assert len(queries) >= 15
    read: set[str] = set()
    for q in queries:
        assert q.series, f"{q.panel} {q.ref} reads no eaglenest series"
        assert q.series <= exported, f"{q.panel} {q.ref}: {q.series - exported} not on /metrics"
        read |= q.series
    # the figures: endpoint latency, invocations and errors, tau, GPU use
    for name in ("eaglenest_endpoint_model_latency_microseconds_bucket",
                 "eaglenest_endpoint_invocations_total",
                 "eaglenest_endpoint_invocation_4xx_errors_total",
                 "eaglenest_endpoint_invocation_5xx_errors_total",
                 "eaglenest_endpoint_accepted_tokens_per_round",
                 "eaglenest_endpoint_gpu_utilization_percent",
                 "eaglenest_endpoint_gpu_memory_utilization_percent",
                 "eaglenest_host_gpu_utilization_percent"):
        assert name in read, name
    assert set(EXPECTED_EMPTY) <= read and set(EXPECTED_EMPTY) <= exported
    for name, query in variable_queries().items():
        assert series_named(query) <= exported, name


def test_the_console_page_reads_the_dashboards_series(exported: set[str]) -> None:
    dashboard = set().union(*(q.series for q in panel_queries()))
    shown = series_named(CONSOLE)
    assert shown and shown <= exported and shown <= dashboard, shown - dashboard
    # the endpoint filter goes into the queries quoted (%q), never pasted into PromQL
    queries = [line for line in CONSOLE.splitlines() if "query (printf" in line]
    assert len(queries) >= 10
    for line in queries:
        assert re.search(r'query \(printf "[^"]*\{endpoint=~%q\}[^"]*" \$ep\)', line), line


def test_variables_are_defined_and_substituted() -> None:
    used = set()
    for q in panel_queries():
        used |= set(re.findall(r"\$(\w+)", q.expr))
    defined = set(variable_queries())
    assert used == defined | {"__rate_interval"}, used
    latency = next(q for q in panel_queries() if q.panel.startswith("ModelLatency"))
    got = substitute(latency.expr, {"account": "1", "endpoint": "a.b-c", "variant": ALL})
    assert 'endpoint=~"a\\\\.b-c"' in got and 'variant=~".*"' in got
    assert f"[{RATE_INTERVAL}]" in got and "$" not in got


def test_grafana_is_provisioned_with_this_prometheus_and_dashboard() -> None:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    (source,) = DATASOURCES["datasources"]
    uids = {t["datasource"]["uid"] for p in board["panels"] for t in p.get("targets", [])}
    assert uids == {source["uid"]} and source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    # the dashboard's $__rate_interval (1m) is Grafana's for this scrape interval
    scrape = SCRAPE["global"]["scrape_interval"]
    assert source["jsonData"]["timeInterval"] == scrape == "15s" and RATE_INTERVAL == "1m"
    (provider,) = PROVIDERS["providers"]
    grafana = COMPOSE["grafana"]
    mounts = dict(v.split(":")[:2][::-1] for v in grafana["volumes"])
    assert mounts[provider["options"]["path"]] == "./docker/grafana/dashboards"
    assert mounts["/etc/grafana/provisioning"] == "./docker/grafana/provisioning"
    assert grafana["profiles"] == ["grafana"]
    assert re.fullmatch(r"grafana/grafana-oss:\d+\.\d+\.\d+", grafana["image"])


def test_prometheus_scrapes_the_api_with_bounded_retention() -> None:
    (job,) = SCRAPE["scrape_configs"]
    assert job["job_name"] == "eaglenest" and job["metrics_path"] == "/metrics"
    api = COMPOSE["api"]["command"]
    assert job["static_configs"][0]["targets"] == [f"api:{api[api.index('--port') + 1]}"]
    prom = COMPOSE["prometheus"]
    flags = dict(f.split("=", 1) for f in prom["command"])
    assert flags["--storage.tsdb.retention.time"].startswith("${PROMETHEUS_RETENTION_TIME:-")
    assert flags["--storage.tsdb.retention.size"].startswith("${PROMETHEUS_RETENTION_SIZE:-")
    mounts = dict(v.split(":")[:2][::-1] for v in prom["volumes"])
    assert mounts[flags["--config.file"]] == "./docker/prometheus/prometheus.yml"
    assert mounts[flags["--storage.tsdb.path"]] == "prometheus-data"
    assert mounts[flags["--web.console.templates"]] == "./docker/prometheus/consoles"
    # the upstream image's release line is the one Debian's package builds in CI
    assert prom["image"] == "prom/prometheus:v2.42.0"
    assert "prometheus" in (ROOT / "docker/ci/prometheus.Dockerfile").read_text()


def test_prometheus_scrapes_with_the_apis_token_from_a_file_it_alone_reads(tmp_path) -> None:
    """The API's /metrics wants EAGLENEST_METRICS_TOKEN; prometheus.yml cannot read the
    environment, so the entrypoint writes the token to the file the scrape names, mode 400,
    then execs Prometheus with the command's flags. Its script is run here with /bin/sh, a
    stand-in `prometheus` on the PATH reporting its arguments and environment, twice (a
    restarted container finds the file of its last start)."""
    (job,) = SCRAPE["scrape_configs"]
    path = "/etc/prometheus/metrics-token"
    assert job["authorization"] == {"type": "Bearer", "credentials_file": path}
    prom, api = COMPOSE["prometheus"], COMPOSE["api"]
    required = "${EAGLENEST_METRICS_TOKEN:?set EAGLENEST_METRICS_TOKEN}"
    assert prom["environment"] == {"EAGLENEST_METRICS_TOKEN": required}
    assert api["environment"]["EAGLENEST_METRICS_TOKEN"] == required
    shell, flag, script, name = prom["entrypoint"]
    assert (shell, flag, name) == ("/bin/sh", "-c", "prometheus")
    token_file, bin_dir = tmp_path / "metrics-token", tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "prometheus"
    fake.write_text('#!/bin/sh\necho "args=$* token=${EAGLENEST_METRICS_TOKEN-unset}"\n')
    fake.chmod(0o755)
    script = script.replace("$$", "$").replace(path, str(token_file))  # compose's $$ is $
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "EAGLENEST_METRICS_TOKEN": "t0ken" * 4}
    for _ in range(2):
        r = subprocess.run([shell, flag, script, name, *prom["command"][:2]], env=env,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"args={' '.join(prom['command'][:2])} token=unset\n"
        assert token_file.read_text() == "t0ken" * 4
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o400
    # the Debian stand-in's user may write there, as the upstream image's `nobody` may
    dockerfile = (ROOT / "docker/ci/prometheus.Dockerfile").read_text()
    assert "chown prometheus:prometheus /prometheus /etc/prometheus" in dockerfile
