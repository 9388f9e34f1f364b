"""The streamed-reply relay against real sockets: a raw asyncio model server, the real
BackendClient, and ASGI `send` callables that complete inline, suspend, or fail. Frames are
decoded with botocore's own event-stream parser, as boto3 would."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest
from botocore.eventstream import EventStreamBuffer

from eaglenest.api.runtime.relay import FrameRelay, send_now
from eaglenest.foundation.http.backend_client import BackendClient, BackendError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def events(texts: list[str]) -> list[bytes]:
    return [b"data: " + json.dumps({"choices": [{"index": 0, "text": t}]}).encode() + b"\n\n"
            for t in texts]


def sse_handler(pieces: list[bytes], delay: float = 0.0, end: bool = True) -> Handler:
    """Answer one request with `pieces` as chunks (`delay` apart), then end the reply (or,
    with end=False, drop the connection mid-reply)."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head = await r.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await r.readexactly(length)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n")
        for piece in pieces:
            w.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await w.drain()
            await asyncio.sleep(delay)
        if end:
            w.write(b"0\r\n\r\n")
            await w.drain()
        w.close()

    return handler


def relay(handler: Handler, send: Callable[[dict], Awaitable[None]], lmi: bool = False,
          parts: list[str] | None = None) -> list[int]:
    """Serve `handler`, relay one reply to `send`; returns the on_chunk frame counts."""
    counts: list[int] = []

    async def main() -> None:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = BackendClient(connect_timeout=2, read_timeout=5)
        try:
            r = await client.post(f"http://127.0.0.1:{port}/v1/completions", {"prompt": "x"})
            await FrameRelay(r, send, lmi, parts, counts.append).run()
        finally:
            await client.aclose()
            server.close()

    asyncio.run(main())
    return counts


def decoded(bodies: list[bytes]) -> list[tuple[str, bytes]]:
    buf = EventStreamBuffer()
    buf.add_data(b"".join(bodies))
    return [(m.headers[":event-type"], m.payload) for m in buf]


class Recorder:
    """An ASGI send; `suspend_every` > 0 makes every n-th call wait for the loop to come
    round `turns` times (a full socket buffer, as uvicorn's send waits for a drain)."""

    def __init__(self, suspend_every: int = 0, turns: int = 3) -> None:
        self.bodies: list[bytes] = []
        self.calls = self.suspended = 0
        self.suspend_every, self.turns = suspend_every, turns

    async def __call__(self, message: dict) -> None:
        self.calls += 1
        if self.suspend_every and self.calls % self.suspend_every == 0:
            self.suspended += 1
            for _ in range(self.turns):
                fut = asyncio.get_running_loop().create_future()
                asyncio.get_running_loop().call_later(0.005, fut.set_result, None)
                await fut
        assert message["type"] == "http.response.body" and message["more_body"] is True
        self.bodies.append(message["body"])


def test_send_now_runs_inline_or_hands_the_rest_to_a_task() -> None:
    async def main() -> None:
        got: list[str] = []

        async def inline(message: dict) -> None:
            got.append(message["body"])

        assert send_now(inline, {"body": "a"}) is None and got == ["a"]

        gate = asyncio.get_running_loop().create_future()

        async def waits(message: dict) -> None:
            await gate
            got.append(message["body"])

        pending = send_now(waits, {"body": "b"})
        assert pending is not None and got == ["a"]
        await asyncio.sleep(0.01)
        assert not pending.done()
        gate.set_result(None)
        await pending
        assert got == ["a", "b"]

        async def sleeps(message: dict) -> None:  # a bare yield, then done
            await asyncio.sleep(0)
            got.append(message["body"])

        pending = send_now(sleeps, {"body": "c"})
        assert pending is not None
        await pending
        assert got == ["a", "b", "c"]

        async def fails_at_once(message: dict) -> None:
            raise OSError("caller gone")

        with pytest.raises(OSError, match="caller gone"):
            send_now(fails_at_once, {})

        failing = asyncio.get_running_loop().create_future()

        async def fails_later(message: dict) -> None:
            await failing

        pending = send_now(fails_later, {})
        assert pending is not None
        failing.set_exception(OSError("reset"))
        with pytest.raises(OSError, match="reset"):
            await pending

    asyncio.run(main())


def test_each_event_becomes_one_payload_part_split_lines_joined() -> None:
    """Three events, one of them split across two chunks and two sharing a chunk: three
    PayloadPart frames carrying the SSE lines unchanged; [DONE] is not relayed."""
    ev = events(["Hello", " world", "!"])
    pieces = [ev[0][:9], ev[0][9:] + ev[1], ev[2] + b"data: [DONE]\n\n"]
    send = Recorder()
    counts = relay(sse_handler(pieces, delay=0.02), send)
    assert decoded(send.bodies) == [("PayloadPart", e) for e in ev]
    assert sum(counts) == 3 and len(send.bodies) == len(counts)


def test_lmi_lines_and_collected_text() -> None:
    ev = events(["Hi", "", " there"])  # an empty piece is not relayed as an LMI token
    parts: list[str] = []
    send = Recorder()
    relay(sse_handler([*ev, b"data: [DONE]\n\n"]), send, lmi=True, parts=parts)
    assert parts == ["Hi", "", " there"]
    assert [p for _, p in decoded(send.bodies)] == [
        b'{"token": {"text": "Hi"}}\n', b'{"token": {"text": " there"}}\n']


def test_order_kept_when_sends_suspend() -> None:
    """Every second send waits (a slow caller): 40 events arrive meanwhile, are held back
    and written after it, in order, none lost; reading resumes once the backlog is out."""
    texts = [f"t{i}" for i in range(40)]
    send = Recorder(suspend_every=2)
    relay(sse_handler(events(texts), delay=0.001), send)
    got = [json.loads(p[6:])["choices"][0]["text"] for _, p in decoded(send.bodies)]
    assert got == texts
    assert send.suspended >= 2


def test_model_server_failure_mid_stream_raises_after_the_frames_before_it() -> None:
    send = Recorder()
    with pytest.raises(BackendError):
        relay(sse_handler(events(["a", "b"]), delay=0.01, end=False), send)
    assert len(decoded(send.bodies)) == 2


def test_unreadable_event_is_a_backend_error() -> None:
    """Text is needed (LMI) and an event is not JSON: the reply ends with BackendError
    (the runtime turns it into a ModelStreamError frame), earlier frames delivered."""
    send = Recorder()
    with pytest.raises(BackendError, match="unreadable event"):
        relay(sse_handler([*events(["ok"]), b"data: {not json\n\n", *events(["late"])],
                          delay=0.01), send, lmi=True, parts=[])
    assert [p for _, p in decoded(send.bodies)] == [b'{"token": {"text": "ok"}}\n']


def test_caller_failing_during_a_suspended_send_ends_the_relay() -> None:
    """The caller's connection fails while a frame waits for it: the relay stops reading
    (the model server's connection is closed) and raises that failure."""

    class Breaks(Recorder):
        async def __call__(self, message: dict) -> None:
            if self.calls == 1:
                self.calls += 1
                await asyncio.sleep(0.01)
                raise OSError("caller reset")
            await super().__call__(message)

    send = Breaks()
    with pytest.raises(OSError, match="caller reset"):
        relay(sse_handler(events([f"t{i}" for i in range(50)]), delay=0.002), send)
    assert len(decoded(send.bodies)) < 50


def test_one_event_chunks_take_the_short_path_with_the_same_frames() -> None:
    """The usual chunk (one whole event) is framed without the line loop; the frames are
    the ones the loop makes (parts=[] forces the loop: it collects text)."""
    short = FrameRelay(None, None, False, None, lambda n: None)  # type: ignore[arg-type]
    loop = FrameRelay(None, None, False, [], lambda n: None)  # type: ignore[arg-type]
    for ev in events(["a", " b c", '"quoted"', ""]) + [b'data: {"x": 1}\r\n\r\n']:
        assert short._frames(ev) == loop._frames(ev)
    assert short._frames(b"data: [DONE]\n\n") == [] and short._frames(b": ping\n\n") == []
    assert loop.parts == ["a", " b c", '"quoted"', "", ""]
