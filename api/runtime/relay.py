"""Streamed replies: the model server's SSE lines to the caller as event-stream frames,
written from the socket callback that received them.

Per streamed token the proxy reads one chunk from the model server and writes one frame to
the caller. Done by the invocation's task, that is a future resolved from `data_received`, a
task switch and two async generators per token, and under concurrency the tokens of
streams that arrive together wait for each other's task switches. Here `FrameRelay.feed` is
the backend response's sink (`BackendResponse.stream_to`): it splits the chunk into lines,
frames them and hands the frames to the ASGI `send` inline (`send_now`). The task only
waits for the end of the reply (`python -m benchmarks.proxy_cpu` measures the proxy's own
time per frame).

Backpressure: uvicorn's `send` for a body part suspends only while the caller's socket
buffer is full. `send_now` then leaves the rest of that send to a task; until it is done the
relay stops reading from the model server (`hold`) and queues what it already had, so
frames keep their order.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.types import Message, Send

from eaglenest.api.runtime import eventstream
from eaglenest.api.runtime.bodies import chunk_text
from eaglenest.foundation.http.backend_client import BackendError, BackendResponse


def send_now(send: Send, message: Message) -> asyncio.Future[None] | None:
    """Run `send(message)` inline: None when it completed without suspending, else a task
    that drives the rest of it. Raises what the send raised before its first suspension.

    A coroutine suspends by yielding the future it waits on (PEP 492 / asyncio's protocol);
    `_drive` waits on that future and resumes the coroutine, as a Task would.
    """
    coro = send(message)
    try:
        yielded = coro.send(None)  # type: ignore[attr-defined]
    except StopIteration:
        return None
    return asyncio.ensure_future(_drive(coro, yielded))  # type: ignore[arg-type]


async def _drive(coro: Coroutine[Any, Any, None], yielded: Any) -> None:
    while True:
        try:
            if yielded is None:  # a bare yield (asyncio.sleep(0)): one loop turn
                await asyncio.sleep(0)
            else:  # a future: resumed once done (its result or error is read inside)
                await asyncio.wait([yielded])
        except BaseException:  # this task was cancelled: so is the send
            coro.close()
            raise
        try:
            yielded = coro.send(None)
        except StopIteration:
            return


class FrameRelay:
    """Feeds on the model server's body chunks; writes PayloadPart frames to `send`.

    `parts` (when not None) collects each event's text: LMI replies are re-framed as JSON
    token lines from it, and Data Capture stores it. `on_chunk(frames)` is called after
    each chunk that produced frames (the proxy's clock).
    """

    def __init__(self, r: BackendResponse, send: Send, lmi: bool, parts: list[str] | None,
                 on_chunk: Callable[[int], None]) -> None:
        self.r, self.send, self.lmi, self.parts = r, send, lmi, parts
        self.on_chunk = on_chunk
        self.pending = b""  # an incomplete last line
        self.backlog: list[bytes] = []  # frames waiting behind a suspended send
        self.sending: asyncio.Future[None] | None = None
        self.error: BaseException | None = None

    # ---- called from the backend's data_received ------------------------------------------
    def feed(self, chunk: bytes) -> None:
        if self.error is not None:
            return
        try:
            frames = self._frames(chunk)
            if frames:
                self._write(b"".join(frames))
                self.on_chunk(len(frames))
        except Exception as exc:  # a malformed line or a failed send: the stream ends
            self._fail(exc)

    def _frames(self, chunk: bytes) -> list[bytes]:
        """Example: pending b'data: {"a"', chunk b': 1}\\n\\ndata: [DONE]\\n\\n' -> lines
        [b'data: {"a": 1}', b'', b'data: [DONE]', b''], pending b'' -> one frame."""
        if (self.parts is None and not self.pending and chunk.startswith(b"data: {")
                and chunk.endswith(b"\n\n") and chunk.count(b"\n") == 2):
            # the usual chunk: one whole event, relayed as it is (what the loop below
            # would make of it, in fewer steps: this runs once per token)
            return [eventstream.payload_part(chunk)]
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        out = []
        for raw in lines:
            line = raw.rstrip(b"\r")
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            payload = line + b"\n\n"
            if self.parts is not None:
                piece = chunk_text(json.loads(line[6:]))
                self.parts.append(piece)
                if self.lmi:
                    if not piece:
                        continue
                    payload = (json.dumps({"token": {"text": piece}}) + "\n").encode()
            out.append(eventstream.payload_part(payload))
        return out

    def _write(self, body: bytes) -> None:
        if self.sending is not None:  # an earlier frame still waits for the caller
            self.backlog.append(body)
            return
        pending = send_now(self.send, {"type": "http.response.body", "body": body,
                                       "more_body": True})
        if pending is not None:
            self.sending = pending
            self.r.hold(True)
            pending.add_done_callback(self._sent)

    def _sent(self, fut: asyncio.Future[None]) -> None:
        self.sending = None
        if fut.cancelled():  # (exception() would raise here)
            self._fail(asyncio.CancelledError())
            return
        error = fut.exception()
        if error is not None:
            self._fail(error)
            return
        if self.backlog:
            body, self.backlog = b"".join(self.backlog), []
            try:
                self._write(body)
            except Exception as exc:  # the caller's connection failed
                self._fail(exc)
                return
        if self.sending is None:
            self.r.hold(False)

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        self.backlog = []
        self.r.close()  # the model server stops; the waiting task sees the end

    # ---- the invocation's task ------------------------------------------------------------
    async def run(self) -> None:
        """Relay until the reply ends; raises the model server's read error, or the relay's."""
        self.r.stream_to(self.feed)
        try:
            await self.r.finished()
        finally:
            await self.drain()
        if isinstance(self.error, ValueError):  # not an SSE event we can read
            raise BackendError(f"unreadable event from the model server: {self.error}")
        if self.error is not None:
            raise self.error

    async def drain(self) -> None:
        """Until every frame handed to `send` has been written."""
        while self.sending is not None:
            await asyncio.wait([self.sending])
