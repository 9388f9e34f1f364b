"""Connection limits of our HTTP servers, enforced below the application: before a request
is parsed into headers, let alone authenticated, so a caller without a key costs a bounded
amount of memory, time and file descriptors. Used by the API (both planes: `POST /` and
`/endpoints/...`; limits from Settings) and by the embedded model server and the split router
(loopback, behind the API; `Limits()` defaults).

uvicorn bounds none of this with httptools (our parser): it reads headers of any size, waits
forever for a request's first bytes and for its body, and takes connections until the
process runs out of file descriptors. `guarded_protocol(limits)` is uvicorn's httptools
protocol plus (docs/security.md, "Connections"):

- **header size**: a request line and headers of more than `max_header_bytes` in all get a
  431 as soon as the limit is passed (nothing past it is parsed or kept); the connection
  then lingers `LINGER_SECONDS`, its input discarded, so the client reads the 431 before the
  close;
- **header timeout**: the request line and headers must arrive within `header_timeout`
  seconds of the connection opening (of the request's first byte on a kept-alive
  connection; the idle time between requests is uvicorn's keep-alive timeout). A trickle
  does not extend it. Past it: 408 and close (just a close if no byte came);
- **body timeout**: once the headers are in, the body must keep coming: no `body_timeout`
  seconds without a byte, and on average at least `min_rate` bytes a second after the
  first `body_timeout` seconds (foundation/http/pace.py; time the application is not reading is
  not counted: flow control holds the client back then, not the client itself). Past
  either: 408 (if no response started) and close; the application's `receive()` returns
  `http.disconnect`;
- **send timeout**: a response the client does not read (writing paused: our buffer is
  full; or the application is done and the rest waits in our buffer) must drain by the
  same two rules, with `send_timeout` for the gap. Past either the connection is reset
  (what neither we nor the kernel delivered is dropped; a graceful close would keep it
  until the client reads), the application's `send()` returns at once and its `receive()`
  returns `http.disconnect`;
- **connections**: at most `max_connections` open at once (and at most half the process's
  open-file limit: the other half is for the database, the broker, model servers and
  files), at most `max_per_address` from one client address. A connection past either cap
  first makes room by closing the one that has been idle longest of those concerned (no
  request in the application and nothing of a response in our buffer: not yet sent its
  headers, between kept-alive requests, or draining a body nobody reads); if every one is
  busy with a request or a response in flight, the new one gets a 503
  (`ServiceUnavailable`, retried by AWS SDKs) and is closed. So idle or half-sent sockets
  never lock out a caller that sends a request, even from the same address (everything on
  loopback is 127.0.0.1), and replies nobody reads count until the send timeout ends them.

Refusals are logged at most every `REPORT_SECONDS` per kind (an attack is not a log flood).
Error bodies are JSON with `__type` and `message`, plus `x-amzn-ErrorType`, so boto3 reads
them on either plane. Websocket upgrades are off (`uvicorn_options`): nothing serves them.
"""

from __future__ import annotations

import asyncio
import json
import time
from http import HTTPStatus
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from eaglenest.foundation.http.connection_limits import LINGER_SECONDS, Limits, OpenConnections
from eaglenest.foundation.http.pace import SLOW, Clock, Pace, reset, unsent


def error_reply(status: int, code: str, message: str) -> bytes:
    """A complete HTTP/1.1 response that closes the connection."""
    body = json.dumps({"__type": code, "message": message}).encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            f"Content-Type: application/json\r\nx-amzn-ErrorType: {code}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under `open_connections.limits` (module docstring). Contract
    with the parent: every parser callback and uvicorn's own bookkeeping run unchanged; this
    class only feeds the parser less (the head is cut at the limit), adds timers, and
    closes connections."""

    open_connections: ClassVar[OpenConnections]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = self.open_connections.limits
        self.address = ""
        self.in_head = True  # the parser awaits (the rest of) a request line and headers
        self.head_bytes = 0
        self.messages = 0  # requests whose last byte came
        self.quiet_since = time.monotonic()  # since when no request is in the application
        self.lingering = False
        self.timer: asyncio.TimerHandle | None = None  # the head's or the linger's
        self.received = 0  # body bytes received (what the body clock sees move)
        self.sent = 0  # response bytes the client took (what the send clock sees move)
        self.pending = 0  # unsent(transport) at the send clock's last look
        self.body_clock: Clock | None = None  # per request; runs until its body is in
        self.send_clock: Clock | None = None  # per connection (from its first reply)

    # -- connection life --------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.address = self.client[0] if self.client else ""
        if not self.open_connections.admit(self):
            self.open_connections.reports.note("refused connections (all busy)", self.address)
            self.reply_and_close(error_reply(
                503, "ServiceUnavailable", "Too many connections; try again later."))
            return
        self.arm(self.limits.header_timeout, self.head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self.open_connections.release(self)
        self.cancel_timer()
        if self.send_clock is not None:
            self.send_clock.stop()
        if self.lingering:
            self.lingering = False
            self.open_connections.lingering -= 1
        super().connection_lost(exc)

    def idle(self) -> bool:
        """No request in the application and no response in our buffer (so closing this
        connection loses no work, and frees what it held at once)."""
        busy = self.cycle is not None and not self.cycle.response_complete
        return not (busy or self.pipeline or self.lingering
                    or self.transport.get_write_buffer_size())

    def close_now(self) -> None:
        """Close; with a reset if some of a response is still in our buffer (a graceful
        close would wait for the client to read it)."""
        self.open_connections.release(self)
        self.cancel_timer()
        if self.transport.get_write_buffer_size():
            reset(self.transport)
        elif not self.transport.is_closing():
            self.transport.close()

    def reply_and_close(self, reply: bytes) -> None:
        """Write `reply`, stop the application's request, then linger (if the budget
        allows) or close."""
        self.open_connections.release(self)
        self.cancel_timer()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the application's sends are dropped from now
            self.cycle.message_event.set()
        if self.transport.is_closing():
            return
        self.transport.write(reply)
        if not (self.open_connections.may_linger() and self.transport.can_write_eof()):
            self.transport.close()
            return
        self.lingering = True
        self.open_connections.lingering += 1
        self.transport.write_eof()
        self.flow.resume_reading()
        self.timer = self.loop.call_later(LINGER_SECONDS, self.close_now)

    # -- timers -----------------------------------------------------------------------
    def arm(self, delay: float, callback: Any) -> None:
        self.cancel_timer()
        self.timer = self.loop.call_later(delay, callback)

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.body_clock is not None:
            self.body_clock.stop()

    def head_timed_out(self) -> None:
        self.timer = None
        if not self.in_head or self.transport.is_closing():
            return
        if not self.head_bytes:  # opened and never used: nothing to answer
            self.open_connections.reports.note("closed connections that sent nothing", self.address)
            self.close_now()
            return
        self.open_connections.reports.note("header timeouts", self.address)
        self.reply_and_close(error_reply(
            408, "RequestTimeout", f"Request headers not received within "
            f"{self.limits.header_timeout:g} s (EAGLENEST_HEADER_TIMEOUT_SECONDS)."))

    def body_progress(self) -> tuple[int, bool]:
        """The body clock's measure: bytes received; whether the client holds the body up
        (not the application: it reads, has not paused us, waits for no 100 Continue and
        is not answering without the rest)."""
        cycle = self.cycle
        waits_on_us = self.flow.read_paused or (cycle is not None and (
            cycle.waiting_for_100_continue
            or (cycle.response_started and not cycle.response_complete)))
        return self.received, not waits_on_us

    def body_late(self, kind: str) -> None:
        if self.in_head or self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self.close_now()  # answered already (a body nobody reads): just close
            return
        self.open_connections.reports.note(f"body timeouts ({kind})", self.address)
        self.reply_and_close(error_reply(408, "RequestTimeout", (
            f"Request body arrived slower than {self.limits.min_rate:g} bytes/s "
            "(EAGLENEST_MIN_TRANSFER_RATE)." if kind == SLOW else
            f"No request body received for {self.limits.body_timeout:g} s "
            "(EAGLENEST_BODY_TIMEOUT_SECONDS).")))

    def send_progress(self) -> tuple[int, bool]:
        """The send clock's measure: bytes the client took (what left our buffer and the
        kernel's since the last look); whether it holds the response up (writing paused,
        or the application done and the rest in our buffer)."""
        pending = unsent(self.transport)
        self.sent += max(0, self.pending - pending)
        self.pending = pending
        cycle = self.cycle
        done = cycle is None or cycle.response_complete
        return self.sent, self.flow.write_paused or (
            done and self.transport.get_write_buffer_size() > 0)

    def send_late(self, kind: str) -> None:
        self.open_connections.reports.note(f"send timeouts ({kind})", self.address)
        self.open_connections.release(self)
        self.cancel_timer()
        reset(self.transport)  # connection_lost: the application's sends end

    def start_send_clock(self) -> None:
        if self.send_clock is None:
            self.send_clock = Clock(self.loop, Pace(self.limits.send_timeout,
                                                    self.limits.min_rate),
                                    self.send_progress, self.send_late)
        if not self.send_clock.running:
            self.pending = unsent(self.transport)
            self.send_clock.start()

    # -- output -----------------------------------------------------------------------
    def pause_writing(self) -> None:
        super().pause_writing()
        self.start_send_clock()

    # -- input ------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return  # answered already: read and dropped
        if not self.in_head:
            self.received += len(data)
            super().data_received(data)
            return
        room = self.limits.max_header_bytes - self.head_bytes
        head, rest = (data, b"") if len(data) <= room else (data[:room], data[room:])
        self.head_bytes += len(head)
        done = self.messages
        if head:
            super().data_received(head)
        if not rest or self.transport.is_closing():
            return
        # the limit passed and the headers are not complete (unless a request ended in
        # `head` and the next began there: a pipelined head gets up to twice the limit)
        if self.in_head and self.messages == done:
            self.open_connections.reports.note("headers too large", self.address)
            self.reply_and_close(error_reply(
                431, "RequestHeaderFieldsTooLarge", f"Request headers are larger than "
                f"{self.limits.max_header_bytes} bytes, the most this service accepts "
                "(EAGLENEST_MAX_HEADER_BYTES)."))
            return
        self.data_received(rest)  # the body (or the next request) after a complete head

    # -- parser callbacks (the parent's, plus the phase this class tracks) --------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.timer is None:  # a kept-alive connection's next request: its clock starts
            self.arm(self.limits.header_timeout, self.head_timed_out)

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.cancel_timer()
        self.body_clock = Clock(self.loop, Pace(self.limits.body_timeout,
                                                self.limits.min_rate),
                                self.body_progress, self.body_late, keep=True)
        self.body_clock.start()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.cancel_timer()
        self.in_head, self.head_bytes = True, 0
        self.messages += 1

    def on_response_complete(self) -> None:
        self.quiet_since = time.monotonic()
        if self.transport.get_write_buffer_size():  # the rest waits for the client
            self.start_send_clock()
        super().on_response_complete()


def guarded_protocol(limits: Limits) -> type[GuardedProtocol]:
    """A protocol class for `uvicorn.Config(http=...)` with its own `OpenConnections`: one
    per server (each server counts its own connections)."""
    return type("GuardedProtocol", (GuardedProtocol,),
                {"open_connections": OpenConnections(limits)})


def uvicorn_options(limits: Limits) -> dict[str, Any]:
    """What a server of ours passes to uvicorn.run / uvicorn.Config on top of its own."""
    return {"http": guarded_protocol(limits), "ws": "none"}
