"""The caps of foundation/http/connections.py (its docstring says what each means): a
server's `Limits`, and `OpenConnections`, the connections one server has open, which admits
a new one (closing the longest idle to make room) or refuses it."""

from __future__ import annotations

import logging
import resource
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eaglenest.foundation.settings import Settings

if TYPE_CHECKING:
    from eaglenest.foundation.http.connections import GuardedProtocol

log = logging.getLogger("eaglenest.connections")

#: how long a connection answered 431 or 503 keeps reading (and discarding) before it is
#: closed, so that the client reads the answer rather than a reset
LINGER_SECONDS = 2.0
#: lingering connections at once: a quarter of the connection cap, at least LINGER_MIN;
#: past it an answered connection is closed at once
LINGER_SHARE = 4
LINGER_MIN = 16
#: the shortest gap between two log lines about refused or closed connections of one kind
REPORT_SECONDS = 10.0


@dataclass(frozen=True)
class Limits:
    max_header_bytes: int = 16 * 1024
    header_timeout: float = 20.0
    body_timeout: float = 20.0
    max_connections: int = 1024
    max_per_address: int = 256
    send_timeout: float = 20.0
    min_rate: float = 500.0  # bytes per second, bodies and responses; 0: no rate rule

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(max_header_bytes=settings.max_header_bytes,
                   header_timeout=settings.header_timeout_seconds,
                   body_timeout=settings.body_timeout_seconds,
                   max_connections=settings.max_connections,
                   max_per_address=settings.max_connections_per_address,
                   send_timeout=settings.send_timeout_seconds,
                   min_rate=settings.min_transfer_rate)


#: the embedded model server's and the split router's: every request comes from the API's
#: proxy (one address), so the cap per address is the server's own. The proxy holds a
#: reply up only while its own caller does, whom the API times: here a looser send clock
#: (no rate rule, three times the gap) that never ends a stream the API still relays
MODEL_SERVER_LIMITS = Limits(max_per_address=Limits.max_connections, send_timeout=60.0,
                             min_rate=0.0)


def open_file_limit() -> int | None:
    """The process's soft limit on open files (None: unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


class Reports:
    """Counts refusals by kind; logs the first at once, then at most every REPORT_SECONDS."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.last: dict[str, float] = {}

    def note(self, kind: str, detail: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        now = time.monotonic()
        if now - self.last.get(kind, -REPORT_SECONDS) >= REPORT_SECONDS:
            log.warning("%s: %d connection(s) since the last report (latest: %s)", kind,
                        self.counts[kind], detail)
            self.last[kind], self.counts[kind] = now, 0


class OpenConnections:
    """One server's open connections, by age and by client address, under its caps
    (`Limits`: connections at once, per address; lingering answered ones)."""

    def __init__(self, limits: Limits, files: int | None = None) -> None:
        self.limits = limits
        files = open_file_limit() if files is None else files
        self.capacity = limits.max_connections
        if files is not None and files // 2 < self.capacity:
            self.capacity = max(1, files // 2)
            log.warning("at most %d connections (half the open-file limit %d), not %d",
                        self.capacity, files, limits.max_connections)
        self.per_address = min(limits.max_per_address, self.capacity)
        self.open: dict[GuardedProtocol, None] = {}  # insertion order: oldest first
        self.by_address: dict[str, dict[GuardedProtocol, None]] = {}
        self.lingering = 0
        self.reports = Reports()

    def admit(self, conn: GuardedProtocol) -> bool:
        """Register `conn`, closing an idle connection to make room if a cap is reached;
        False (not registered) when every connection concerned is busy."""
        same = self.by_address.get(conn.address, {})
        if len(same) >= self.per_address and not self._evict(same, conn.address):
            return False
        if len(self.open) >= self.capacity and not self._evict(self.open, "any address"):
            return False
        self.open[conn] = None
        self.by_address.setdefault(conn.address, {})[conn] = None
        return True

    def _evict(self, conns: dict[GuardedProtocol, None], whose: str) -> bool:
        idle = [c for c in conns if c.idle()]
        if not idle:
            return False
        victim = min(idle, key=lambda c: c.quiet_since)
        self.reports.note("closed idle connections to make room", whose)
        victim.close_now()
        return True

    def release(self, conn: GuardedProtocol) -> None:
        self.open.pop(conn, None)
        same = self.by_address.get(conn.address)
        if same is not None:
            same.pop(conn, None)
            if not same:
                del self.by_address[conn.address]

    def may_linger(self) -> bool:
        return self.lingering < max(LINGER_MIN, self.capacity // LINGER_SHARE)
