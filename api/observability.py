"""Prometheus `/metrics` for the API (prometheus_client), and the API's share of the metric
store (db/metrics_repo.py): the "AWS/SageMaker" data of every invocation.

What a scrape shows (docs/observability.md lists every family and its unit):
- this process's counters: requests and their seconds by operation and code
  (`eaglenest_requests_total`, `eaglenest_request_seconds_total`), sagemaker-runtime
  invocations by code and the proxy's own time (`eaglenest_runtime_*`), and per (account,
  endpoint, variant) invocations, 4xx and 5xx errors and the ModelLatency / OverheadLatency
  histograms in microseconds (`eaglenest_endpoint_*`);
- read from the database at scrape time (`StoreCollector`): jobs and endpoints by status,
  each host's GPUs and those held, whether the database and the broker answer, and the last
  minute of the store's worker-side namespaces (`LATEST`) as gauges with an `account` label.

Nothing is built at import time: `ApiMetrics.build` makes the registry, the metric objects
and the MetricBuffer of one app. With PROMETHEUS_MULTIPROC_DIR set (prometheus_client's own
variable, which the library reads when it is first imported: set it before the API
processes start, to an empty folder they share), the counters and histograms live in files
there and a scrape of any process sums every process's (MultiProcessCollector).

Who may scrape (`scrape_refusal`): a page of every account's series is no caller's to read,
so /metrics takes no SigV4 key. With EAGLENEST_METRICS_TOKEN set it asks for that bearer
token; unset, it answers loopback clients only (the single-host `eaglenest up`, whose
loopback is its operator's).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from eaglenest.db import metrics_repo, placement_repo
from eaglenest.db.metric_buffer import MetricBuffer
from eaglenest.db.metrics_repo import Datum
from eaglenest.db.session import Database
from eaglenest.db.tables import EndpointRow, OptimizationJobRow
from eaglenest.foundation.settings import Settings

log = logging.getLogger("eaglenest.api")

SAGEMAKER = "AWS/SageMaker"
#: the store's namespaces shown on /metrics: namespace -> (family prefix, the names shown,
#: None for all). A family is the prefix, the metric's name in snake case and its unit
#: (`_percent`, `_microseconds`): CPUUtilization of /aws/sagemaker/Endpoints is
#: `eaglenest_endpoint_cpu_utilization_percent`. AWS/SageMaker's invocation figures are
#: this process's own families; only ModelSetupTime (written by the workers) comes from
#: the store. The hosts' GPUsHeld is `eaglenest_host_gpus_held`, from the placement table.
LATEST: dict[str, tuple[str, frozenset[str] | None]] = {
    SAGEMAKER: ("eaglenest_endpoint_", frozenset({"ModelSetupTime"})),
    "/aws/sagemaker/Endpoints": ("eaglenest_endpoint_", None),
    "EagleNest/Endpoints": ("eaglenest_endpoint_", None),
    "EagleNest/OptimizationJobs": ("eaglenest_job_", None),
    "EagleNest/Hosts": ("eaglenest_host_", frozenset({
        "CPUUtilization", "GPUUtilization", "GPUMemoryUtilization"})),
}
#: a store series shows while its last minute is at most this old (workers write about
#: once a minute)
LATEST_SECONDS = 180.0
#: dimension -> label (others: the dimension's name in snake case)
LABELS = {"EndpointName": "endpoint", "VariantName": "variant",
          "OptimizationJobName": "job", "Host": "host", "GPU": "gpu"}
UNIT_SUFFIX = {"Percent": "_percent", "Microseconds": "_microseconds", "Seconds": "_seconds"}
#: ModelLatency: a small model's reply in milliseconds up to a long generation's minutes
MODEL_BUCKETS_US = (1e3, 2.5e3, 5e3, 1e4, 2.5e4, 5e4, 1e5, 2.5e5, 5e5, 1e6, 2.5e6, 5e6,
                    1e7, 3e7, 6e7, 1.2e8)
#: OverheadLatency: the proxy's own time, tens of microseconds when all goes well
OVERHEAD_BUCKETS_US = (25.0, 50.0, 100.0, 250.0, 500.0, 1e3, 2.5e3, 5e3, 1e4, 2.5e4, 1e5,
                       1e6)
ENDPOINT_LABELS = ("account", "endpoint", "variant")
#: with no EAGLENEST_METRICS_TOKEN, /metrics answers clients of these networks only
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
#: headers a proxy adds in front of the API: a request with one came through a proxy, so
#: its loopback address is the proxy's, not its client's
PROXY_HEADERS = ("x-forwarded-for", "forwarded", "x-real-ip")
#: EAGLENEST_METRICS_TOKEN's form: 16 or more of the characters of a bearer token (RFC 6750)
TOKEN_CHAR = r"[A-Za-z0-9._~+/=-]"
TOKEN_FORM = re.compile(TOKEN_CHAR + "{16,}")
TOKEN_HINT = ("set EAGLENEST_METRICS_TOKEN on the API and send it as "
              "`Authorization: Bearer <token>`")


@dataclass(frozen=True)
class Refusal:
    """A refused scrape: its status, plain-text message and headers."""

    status: int
    message: str
    headers: dict[str, str]


def is_loopback(host: str | None) -> bool:
    """127.0.0.0/8 and ::1, also IPv4-mapped (::ffff:127.0.0.1); a name or None: False."""
    try:
        ip = ipaddress.ip_address(host or "")
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in LOOPBACK)


def checked_token(token: str | None) -> str | None:
    """EAGLENEST_METRICS_TOKEN as the API takes it (None: unset), or a ValueError naming the
    variable and the form it needs; never its value, which is a secret."""
    if token is not None and not TOKEN_FORM.fullmatch(token):
        others = len(re.sub(TOKEN_CHAR, "", token))
        raise ValueError("EAGLENEST_METRICS_TOKEN must be at least 16 characters of A-Z a-z "
                         "0-9 - . _ ~ + / = (e.g. `openssl rand -hex 32`); it has "
                         f"{len(token)}, {others} of them other characters")
    return token


def scrape_refusal(token: str | None, client: str | None,
                   headers: Mapping[str, str]) -> Refusal | None:
    """None when this request may read /metrics, else why not (docs/observability.md):

    - `token` set: the request must carry `Authorization: Bearer <token>` (compared in
      constant time), from any address, loopback included; else 401 with
      `WWW-Authenticate: Bearer`;
    - `token` unset: the client must be loopback and the request must carry none of
      PROXY_HEADERS; else 403.

    `client` is the ASGI scope's client host. uvicorn rewrites it from X-Forwarded-For when
    the peer is in FORWARDED_ALLOW_IPS (loopback by default); refusing every request that
    carries such a header means no header makes a remote client pass for loopback.
    """
    if token is not None:
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return Refusal(401, f"/metrics needs a bearer token: {TOKEN_HINT}.",
                           {"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(given.strip().encode("utf-8", "replace"),
                                   token.encode("utf-8")):
            return Refusal(401, "/metrics: the bearer token is not EAGLENEST_METRICS_TOKEN.",
                           {"WWW-Authenticate": 'Bearer error="invalid_token"'})
        return None
    if is_loopback(client) and not any(h in headers for h in PROXY_HEADERS):
        return None
    return Refusal(403, "/metrics answers loopback clients only while "
                   f"EAGLENEST_METRICS_TOKEN is unset: {TOKEN_HINT}.", {})


def snake(name: str) -> str:
    """CloudWatch's CamelCase name in snake case: CPUUtilization -> cpu_utilization."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


class BrokerProbe:
    """Whether the broker answers, asked at most once per `ttl` seconds (every /ping and
    scrape would otherwise open a connection of its own)."""

    def __init__(self, check: Callable[[], bool], ttl: float = 1.0) -> None:
        self.check, self.ttl = check, ttl
        self._lock = threading.Lock()
        self._at, self._up = -float("inf"), False

    def up(self) -> bool:
        with self._lock:
            if time.monotonic() - self._at < self.ttl:
                return self._up
            self._up, self._at = self.check(), time.monotonic()
            return self._up


@dataclass(frozen=True)
class Invocation:
    """One InvokeEndpoint[WithResponseStream] of an existing endpoint of the caller's
    account, as the metrics count it."""

    account_id: str
    endpoint: str  # the endpoint's name as it was created
    variant: str
    instances: int  # the variant's instances (InvocationsPerInstance = 1 / instances)
    #: what 4XX / 5XX are decided on: the model server's status when it answered non-2xx
    #: or not at all (500), else the status of the reply the caller got
    status: int
    model_seconds: float | None  # request out -> reply's end in; None: no complete reply
    overhead_seconds: float

    def data(self, at: float) -> list[Datum]:
        """The "AWS/SageMaker" data, as SageMaker writes them per invocation."""
        dims = (("EndpointName", self.endpoint), ("VariantName", self.variant))
        c4, c5 = int(400 <= self.status < 500), int(self.status >= 500)
        out = [Datum(SAGEMAKER, "Invocations", dims, 1.0, "Count", at),
               Datum(SAGEMAKER, "Invocation4XXErrors", dims, float(c4), "Count", at),
               Datum(SAGEMAKER, "Invocation5XXErrors", dims, float(c5), "Count", at),
               Datum(SAGEMAKER, "InvocationsPerInstance", dims, 1.0 / max(1, self.instances),
                     "Count", at),
               Datum(SAGEMAKER, "OverheadLatency", dims, self.overhead_seconds * 1e6,
                     "Microseconds", at)]
        if self.model_seconds is not None:
            out.append(Datum(SAGEMAKER, "ModelLatency", dims, self.model_seconds * 1e6,
                             "Microseconds", at))
        return out


class _Families:
    """This process's counters and histograms (in PROMETHEUS_MULTIPROC_DIR's files when
    set), registered on `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter("eaglenest_requests", "Requests by operation and code",
                                ("operation", "code"), registry=r)
        self.request_seconds = Counter("eaglenest_request_seconds",
                                       "Seconds spent on requests, by operation",
                                       ("operation",), registry=r)
        self.runtime = Counter("eaglenest_runtime_invocations",
                               "sagemaker-runtime invocations by error code (OK: none)",
                               ("code",), registry=r)
        self.frames = Counter("eaglenest_runtime_frames",
                              "Event-stream frames relayed to callers", registry=r)
        self.proxy_seconds = Counter(
            "eaglenest_runtime_proxy_seconds", "The proxy's own seconds on invocations "
            "(waiting on the model server excluded)", registry=r)
        self.forward_seconds = Counter(
            "eaglenest_runtime_forward_seconds",
            "Seconds from an invocation's arrival to its sending to the model server",
            registry=r)
        self.invocations = Counter("eaglenest_endpoint_invocations",
                                   "Invocations (SageMaker's Invocations)", ENDPOINT_LABELS,
                                   registry=r)
        self.errors4 = Counter("eaglenest_endpoint_invocation_4xx_errors",
                               "Invocations that failed with a 4xx (Invocation4XXErrors)",
                               ENDPOINT_LABELS, registry=r)
        self.errors5 = Counter("eaglenest_endpoint_invocation_5xx_errors",
                               "Invocations that failed with a 5xx (Invocation5XXErrors)",
                               ENDPOINT_LABELS, registry=r)
        self.model = Histogram("eaglenest_endpoint_model_latency_microseconds",
                               "Request out to the model server -> its reply's end back "
                               "(ModelLatency)", ENDPOINT_LABELS, registry=r,
                               buckets=MODEL_BUCKETS_US)
        self.overhead = Histogram("eaglenest_endpoint_overhead_latency_microseconds",
                                  "The proxy's own time on an invocation (OverheadLatency)",
                                  ENDPOINT_LABELS, registry=r, buckets=OVERHEAD_BUCKETS_US)


class StoreCollector(Collector):
    """What a scrape reads from the database: jobs and endpoints by status, hosts' GPUs,
    the store's last minutes (`LATEST`), and whether the database and the broker answer.
    A scrape answers during a database outage (eaglenest_database_up 0)."""

    def __init__(self, db: Database, lease_seconds: float, broker: BrokerProbe | None,
                 started: float) -> None:
        self.db, self.lease_seconds, self.broker = db, lease_seconds, broker
        self.started = started

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("eaglenest_database_up", "Whether the database answers")
        try:
            yield from self._counts()
            up.add_metric([], 1)
        except Exception as exc:  # the scrape still answers during a database outage
            log.warning("/metrics: the database did not answer: %s", exc)
            up.add_metric([], 0)
        yield up
        if up.samples[0].value:
            yield from self._latest()
        if self.broker is not None:
            yield GaugeMetricFamily("eaglenest_broker_up", "Whether the broker answers",
                                    value=int(self.broker.up()))
        yield GaugeMetricFamily("eaglenest_uptime_seconds", "Seconds since the API started",
                                value=round(time.time() - self.started, 1))

    def _counts(self) -> list[Metric]:
        """Read in full before any is yielded: a failure midway shows none of them."""
        jobs = GaugeMetricFamily("eaglenest_optimization_jobs",
                                 "Optimization jobs by status", labels=["status"])
        endpoints = GaugeMetricFamily("eaglenest_endpoints", "Endpoints by status",
                                      labels=["status"])
        gpus = GaugeMetricFamily("eaglenest_host_gpus", "GPUs of a host's live workers",
                                 labels=["host"])
        held = GaugeMetricFamily("eaglenest_host_gpus_held", "GPUs held on a host",
                                 labels=["host"])
        with self.db.session() as session:
            for table, family in ((OptimizationJobRow, jobs), (EndpointRow, endpoints)):
                status = table.status  # type: ignore[attr-defined]
                for value, n in session.execute(select(status, func.count()).group_by(status)):
                    family.add_metric([str(value)], n)
            for host, (total, taken) in placement_repo.gpu_totals(
                    session, self.lease_seconds).items():
                gpus.add_metric([host], total)
                held.add_metric([host], taken)
        return [jobs, endpoints, gpus, held]

    def _latest(self) -> Iterable[Metric]:
        families: dict[str, tuple[str, GaugeMetricFamily]] = {}
        since = time.time() - LATEST_SECONDS
        try:
            with self.db.session() as session:
                found = {ns: metrics_repo.latest(session, ns, since) for ns in LATEST}
        except Exception as exc:
            log.warning("/metrics: the metric store could not be read: %s", exc)
            return []
        for namespace, rows in found.items():
            prefix, names = LATEST[namespace]
            for account_id, d in rows:
                if names is not None and d.name not in names:
                    continue
                family = prefix + snake(d.name) + UNIT_SUFFIX.get(d.unit, "")
                owner, metric = families.setdefault(family, (namespace, GaugeMetricFamily(
                    family, f"{namespace} {d.name} ({d.unit}), its last minute's average")))
                if owner != namespace:  # two namespaces, one family name: the first wins
                    continue
                labels = {"account": account_id,
                          **{LABELS.get(k, snake(k)): v for k, v in d.dimensions}}
                metric.add_sample(family, labels, d.value)
        return [metric for _, metric in families.values()]


class ApiMetrics:
    """One app's metrics: this process's families, the scrape registry and the MetricBuffer
    that takes the invocations' "AWS/SageMaker" data (`start` and `close` belong to the
    app's lifespan; `invocation` only appends in memory: never waits on the database)."""

    def __init__(self, families: _Families, registry: CollectorRegistry,
                 buffer: MetricBuffer) -> None:
        self.families, self.registry, self.buffer = families, registry, buffer

    @classmethod
    def build(cls, settings: Settings, db: Database, broker: BrokerProbe | None,
              multiproc_dir: str | None = None) -> ApiMetrics:
        """`multiproc_dir`: PROMETHEUS_MULTIPROC_DIR (default: from the environment, where
        prometheus_client itself reads it)."""
        if multiproc_dir is None:
            multiproc_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
        own = CollectorRegistry()
        families = _Families(own)
        if multiproc_dir:  # every process's files, summed; `own` is not scraped
            scrape = CollectorRegistry()
            MultiProcessCollector(scrape, path=multiproc_dir)
        else:
            scrape = own
        scrape.register(StoreCollector(db, settings.job_lease_seconds, broker, time.time()))
        buffer = MetricBuffer(db, settings.metrics_max_series_per_account,
                              settings.metrics_flush_seconds,
                              retention_seconds=settings.metrics_retention_days * 86400.0)
        return cls(families, scrape, buffer)

    def observe(self, operation: str, code: str, seconds: float) -> None:
        self.families.requests.labels(operation, code).inc()
        self.families.request_seconds.labels(operation).inc(seconds)

    def observe_invocation(self, code: str, proxy_seconds: float, frames: int,
                           forward_seconds: float) -> None:
        """One sagemaker-runtime invocation: `proxy_seconds` is the proxy's own time on it
        (request in -> request out to the model server, and each chunk in -> its frame out;
        time spent waiting on the model server is not in it); `forward_seconds` is the
        first part alone (request in -> out to the model server)."""
        f = self.families
        f.runtime.labels(code).inc()
        if frames:
            f.frames.inc(frames)
        f.proxy_seconds.inc(proxy_seconds)
        f.forward_seconds.inc(forward_seconds)

    def invocation(self, inv: Invocation) -> None:
        """An invocation of an existing endpoint: its families and its store data."""
        f, labels = self.families, (inv.account_id, inv.endpoint, inv.variant)
        f.invocations.labels(*labels).inc()
        # both error series exist from the first invocation on (0 until one fails)
        f.errors4.labels(*labels).inc(int(400 <= inv.status < 500))
        f.errors5.labels(*labels).inc(int(inv.status >= 500))
        if inv.model_seconds is not None:
            f.model.labels(*labels).observe(inv.model_seconds * 1e6)
        f.overhead.labels(*labels).observe(inv.overhead_seconds * 1e6)
        self.buffer.add_many(inv.account_id, inv.data(time.time()))

    def render(self) -> bytes:
        """The exposition text (Prometheus text format 0.0.4)."""
        return generate_latest(self.registry)

    def start(self) -> None:
        self.buffer.start()

    def close(self) -> None:
        """Write what the buffer holds and stop its thread."""
        self.buffer.close()
