"""Prometheus `/metrics` for the API: requests and errors by operation and code (this
process), job and endpoint counts by status (from the database, at scrape time), and
whether the database and the broker answer (`eaglenest_database_up`,
`eaglenest_broker_up`)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from eaglenest.db import placement_repo
from eaglenest.db.session import Database
from eaglenest.db.tables import EndpointRow, OptimizationJobRow


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


class ApiMetrics:
    def __init__(self, lease_seconds: float = 60.0) -> None:
        #: a worker silent this long no longer counts its GPUs (Settings.job_lease_seconds)
        self.lease_seconds = lease_seconds
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str]] = Counter()  # (operation, code) -> n
        self.seconds: dict[str, float] = {}  # operation -> total seconds
        self.invocations: Counter[str] = Counter()  # sagemaker-runtime, by code
        self.frames = 0
        self.proxy_seconds = 0.0
        self.forward_seconds = 0.0
        self.started = time.time()

    def observe(self, operation: str, code: str, seconds: float) -> None:
        with self._lock:
            self.requests[(operation, code)] += 1
            self.seconds[operation] = self.seconds.get(operation, 0.0) + seconds

    def observe_invocation(self, code: str, proxy_seconds: float, frames: int,
                           forward_seconds: float) -> None:
        """One sagemaker-runtime invocation: `proxy_seconds` is the proxy's own time on it
        (request in -> request out to the model server, and each chunk in -> its frame out;
        time spent waiting on the model server is not in it); `forward_seconds` is the
        first part alone (request in -> out to the model server)."""
        with self._lock:
            self.invocations[code] += 1
            self.frames += frames
            self.proxy_seconds += proxy_seconds
            self.forward_seconds += forward_seconds

    def _render_runtime(self, lines: list[str]) -> None:
        lines.append("# TYPE eaglenest_runtime_invocations_total counter")
        for code, n in sorted(self.invocations.items()):
            lines.append(f'eaglenest_runtime_invocations_total{{code="{code}"}} {n}')
        lines.append("# TYPE eaglenest_runtime_frames_total counter")
        lines.append(f"eaglenest_runtime_frames_total {self.frames}")
        lines.append("# TYPE eaglenest_runtime_proxy_seconds_total counter")
        lines.append(f"eaglenest_runtime_proxy_seconds_total {self.proxy_seconds:.6f}")
        lines.append("# TYPE eaglenest_runtime_forward_seconds_total counter")
        lines.append(f"eaglenest_runtime_forward_seconds_total {self.forward_seconds:.6f}")

    def render(self, db: Database, broker: BrokerProbe | None = None) -> str:
        lines = ["# TYPE eaglenest_requests_total counter"]
        with self._lock:
            self._render_runtime(lines)
            for (op, code), n in sorted(self.requests.items()):
                lines.append(f'eaglenest_requests_total{{operation="{op}",code="{code}"}} {n}')
            lines.append("# TYPE eaglenest_request_seconds_total counter")
            for op, secs in sorted(self.seconds.items()):
                lines.append(f'eaglenest_request_seconds_total{{operation="{op}"}} {secs:.6f}')
        lines.append("# TYPE eaglenest_optimization_jobs gauge")
        lines.append("# TYPE eaglenest_endpoints gauge")
        try:
            with db.session() as session:
                for table, metric in ((OptimizationJobRow, "eaglenest_optimization_jobs"),
                                      (EndpointRow, "eaglenest_endpoints")):
                    status_col = table.status  # type: ignore[attr-defined]
                    rows = session.execute(
                        select(status_col, func.count()).group_by(status_col))
                    for status, n in rows:
                        lines.append(f'{metric}{{status="{status}"}} {n}')
                lines += _gpu_lines(session, self.lease_seconds)
            lines.append("eaglenest_database_up 1")
        except Exception:  # the scrape still answers during a database outage
            lines.append("eaglenest_database_up 0")
        if broker is not None:
            lines.append("# TYPE eaglenest_broker_up gauge")
            lines.append(f"eaglenest_broker_up {int(broker.up())}")
        lines.append(f"eaglenest_uptime_seconds {time.time() - self.started:.1f}")
        return "\n".join(lines) + "\n"


def _gpu_lines(session: Session, lease_seconds: float) -> list[str]:
    """Per host: the GPUs its live workers have and those held (db/placement_repo.py)."""
    lines = ["# TYPE eaglenest_host_gpus gauge", "# TYPE eaglenest_host_gpus_held gauge"]
    for host, (total, held) in placement_repo.gpu_totals(session, lease_seconds).items():
        lines.append(f'eaglenest_host_gpus{{host="{host}"}} {total}')
        lines.append(f'eaglenest_host_gpus_held{{host="{host}"}} {held}')
    return lines
