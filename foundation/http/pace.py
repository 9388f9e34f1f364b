"""How long a transfer that waits on its client may take, in either direction: a request
body coming in, a response going out. foundation/http/connections.py applies this one rule to
both, on every server of ours (both planes of the API, the model servers).

A transfer is timed only while the client holds it up (`held`: the application waits for
body bytes that do not come, or the response waits in our buffers for the client to read
it), never while the application itself is busy. Two limits, whichever comes first:

- **gap**: `gap` seconds of that time with no byte moved: stalled (a client gone silent);
- **rate**: more than `gap + moved / min_rate` seconds of that time in all: too slow. The
  first `gap` seconds are free, each `min_rate` bytes moved buys one more (Apache's
  mod_reqtimeout `MinRate`). It bounds what the gap cannot: a byte every `gap - 1`
  seconds, or a reader that takes a segment every `gap - 1` seconds, would hold a
  connection for as long as the body lasts. `min_rate` 0: no rate limit.

A `Clock` samples a transfer on a timer (what it moved so far, whether the client holds it
up now) and hands the verdict (`STALLED`, `SLOW`) to its owner. Time between two samples
counts as held only when both saw it held, so a client is never charged for the
application's time (at worst it gets up to two sampling periods more).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import termios
from collections.abc import Callable
from dataclasses import dataclass

STALLED = "stalled"
SLOW = "slow"
#: the longest time between two samples (the held state is only seen when sampled)
POLL_SECONDS = 1.0
#: the shortest
MIN_TICK_SECONDS = 0.02


@dataclass
class Pace:
    """The gap and rate rules over one transfer (module docstring)."""

    gap: float
    min_rate: float  # bytes per second; 0: no rate rule
    waited: float = 0.0  # seconds the client held the transfer up
    moved: int = 0  # bytes moved in all
    quiet: float = 0.0  # held seconds since the last byte moved

    def step(self, elapsed: float, moved: int, held: bool) -> str | None:
        """Account `elapsed` seconds in which `moved` bytes moved (`held`: the client held
        the transfer up all along); the verdict, None while on time."""
        self.moved += moved
        if not held:
            self.quiet = 0.0
            return None
        self.waited += elapsed
        self.quiet = 0.0 if moved else self.quiet + elapsed
        if self.quiet >= self.gap:
            return STALLED
        if self.min_rate and self.waited > self.gap + self.moved / self.min_rate:
            return SLOW
        return None

    def due(self) -> float:
        """Held seconds until a verdict if no byte moves meanwhile."""
        left = self.gap - self.quiet
        if self.min_rate:
            left = min(left, self.gap + self.moved / self.min_rate - self.waited)
        return max(left, 0.0)


class Clock:
    """A `Pace` sampled on a timer. `measure()` -> (bytes moved so far, a running count;
    whether the client holds the transfer up now); `verdict(kind)` is called once, and the
    clock stops, when a rule is broken. Started by its owner when a transfer may wait on
    the client; it stops itself at a sample that finds the client not holding it up unless
    `keep` (a request body: the client may start holding it up at any time)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pace: Pace,
                 measure: Callable[[], tuple[int, bool]], verdict: Callable[[str], None],
                 keep: bool = False) -> None:
        self.loop, self.pace, self.measure, self.verdict = loop, pace, measure, verdict
        self.keep = keep
        self.timer: asyncio.TimerHandle | None = None
        self.at, self.done, self.held = 0.0, 0, False

    @property
    def running(self) -> bool:
        return self.timer is not None

    def start(self) -> None:
        """Time the transfer from now, the client holding it up (no-op if running)."""
        if self.timer is None:
            self.at, self.held = self.loop.time(), True
            self.done = self.measure()[0]
            self._schedule()

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _schedule(self) -> None:
        delay = min(POLL_SECONDS, max(MIN_TICK_SECONDS, self.pace.due()))
        self.timer = self.loop.call_later(delay, self._tick)

    def _tick(self) -> None:
        self.timer = None
        now = self.loop.time()
        done, held = self.measure()
        kind = self.pace.step(now - self.at, done - self.done, held and self.held)
        self.at, self.done, self.held = now, done, held
        if kind is not None:
            self.verdict(kind)
        elif held or self.keep:
            self._schedule()


def unsent(transport: asyncio.WriteTransport) -> int:
    """Bytes written to `transport` that the client has not received yet: our buffer, plus
    the kernel's (sent but unacknowledged, or not sent yet: Linux TIOCOUTQ). The kernel's
    moves a segment at a time, ours only when the kernel's has room (a third of a send
    buffer of up to megabytes), so a slow reader's progress is seen in the former first."""
    pending = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is None or not hasattr(termios, "TIOCOUTQ"):
        return pending
    try:
        out = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except OSError:  # closed meanwhile, or not a TCP socket
        return pending
    return pending + int(struct.unpack("i", out)[0])


def reset(transport: asyncio.WriteTransport) -> None:
    """Close `transport` at once with a reset, dropping what neither we nor the kernel
    delivered (a graceful close would keep it until the client reads it: forever, for a
    client that does not read)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
