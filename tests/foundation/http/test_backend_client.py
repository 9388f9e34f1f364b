"""The runtime proxy's HTTP client against real sockets: a raw asyncio server that answers
exactly as scripted (chunked SSE, Content-Length JSON, closing idle or mid-reply)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable

import pytest

from eaglenest.foundation.http.backend_client import (
    BackendClient,
    BackendConnectError,
    BackendError,
    BackendTimeout,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    line, *fields = head.split("\r\n")
    length = next(int(f.split(":")[1]) for f in fields if f.lower().startswith("content-length"))
    return line, json.loads(await reader.readexactly(length))


def run(handler: Handler, body: Callable[[str, BackendClient], Awaitable[None]]) -> list[int]:
    """Serve `handler` on a free port, run `body(url, client)`; returns connection ids."""
    conns: list[int] = []

    async def main() -> None:
        async def counted(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            conns.append(len(conns))
            try:
                await handler(r, w)
            finally:
                w.close()

        server = await asyncio.start_server(counted, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = BackendClient(connect_timeout=2, read_timeout=5)
        try:
            await body(f"http://127.0.0.1:{port}", client)
        finally:
            await client.aclose()
            server.close()

    asyncio.run(main())
    return conns


async def sse_server(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    """Keep-alive: each request gets 3 SSE events, one chunk each, split mid-line once."""
    while True:
        try:
            line, body = await read_request(r)
        except asyncio.IncompleteReadError:
            return
        if not line.startswith("POST /v1/completions") or body != {"prompt": "hi"}:
            return  # no reply: the client's read fails
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n")
        for piece in (b'data: {"n": 1}\n\ndata: {"n"', b': 2}\n\n', b"data: [DONE]\n\n"):
            w.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await w.drain()
        w.write(b"0\r\n\r\n")
        await w.drain()


def test_chunked_lines_and_keep_alive() -> None:
    async def body(url: str, client: BackendClient) -> None:
        for _ in range(3):
            r = await client.post(url + "/v1/completions", {"prompt": "hi"})
            assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
            lines = [x for x in (await r.aread()).decode().split("\n") if x]
            assert lines == ['data: {"n": 1}', 'data: {"n": 2}', "data: [DONE]"]

    assert run(sse_server, body) == [0]  # three requests, one connection


def test_content_length_reply_and_error_status() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        payload = b'{"error": "bad top_p"}'
        w.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n%s"
                % (len(payload), payload))
        await w.drain()
        await asyncio.sleep(1)

    async def body(url: str, client: BackendClient) -> None:
        r = await client.post(url + "/v1/completions", {"prompt": "hi"})
        assert r.status_code == 400
        assert json.loads(await r.aread()) == {"error": "bad top_p"}

    run(handler, body)


def test_idle_connection_closed_by_server_is_retried_once() -> None:
    """The server answers one request per connection, then closes it: the pooled
    connection is dead on the next request, which goes out again on a fresh one."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await w.drain()

    async def body(url: str, client: BackendClient) -> None:
        for _ in range(3):
            r = await client.post(url + "/x", {"prompt": "hi"})
            assert await r.aread() == b"{}"
            await asyncio.sleep(0.05)  # the server's close reaches the pooled socket

    assert len(run(handler, body)) >= 3


def test_refused_connection_and_mid_reply_close() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]  # bound, not listening: connections are refused

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"partial\"")
        await w.drain()

    async def body(url: str, client: BackendClient) -> None:
        with pytest.raises(BackendConnectError):
            await client.post(f"http://127.0.0.1:{dead_port}/x", {})
        r = await client.post(url + "/x", {})
        with pytest.raises(BackendError, match="closed the connection mid-reply"):
            await r.aread()

    run(handler, body)


def test_chunked_reply_cut_short_is_an_error_and_a_close_delimited_one_is_not() -> None:
    """A chunked reply whose connection closes before the last (empty) chunk was cut short
    (a model server killed mid-stream); a reply without length or chunking ends at the close."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        line, _ = await read_request(r)
        if line.startswith("POST /cut"):
            w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n")
        else:
            w.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await w.drain()

    async def body(url: str, client: BackendClient) -> None:
        r = await client.post(url + "/cut", {})
        with pytest.raises(BackendError, match="closed the connection mid-reply"):
            await r.aread()
        r = await client.post(url + "/whole", {})
        assert await r.aread() == b"all of it"

    run(handler, body)


def test_silent_server_is_a_read_timeout_and_a_slow_one_is_not() -> None:
    """The read timeout counts from the last bytes received: a reply whose chunks keep
    coming (each within the timeout) is read to its end even when it lasts longer than the
    timeout, one that goes silent fails with BackendTimeout."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        _, body = await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(6):
            w.write(b"2\r\nok\r\n")
            await w.drain()
            await asyncio.sleep(0.1)
        if body.get("silent"):
            await asyncio.sleep(2)
        w.write(b"0\r\n\r\n")
        await w.drain()

    async def body(url: str, client: BackendClient) -> None:
        client.read_timeout = 0.3
        r = await client.post(url + "/x", {})
        assert await r.aread() == b"ok" * 6  # 0.6 s in all, 0.1 s between chunks
        r = await client.post(url + "/x", {"silent": True})
        with pytest.raises(BackendTimeout, match="sent nothing for 0.3 s"):
            await r.aread()

    run(handler, body)


def test_close_stops_a_waiting_reader_and_drops_the_connection() -> None:
    """Closing a response while its body is being read (the caller went away) ends the
    reader's loop at once and closes the socket, so the server sees the client go."""
    seen_eof = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n")
        await w.drain()
        await r.read()  # returns at the client's close
        seen_eof.set()

    async def body(url: str, client: BackendClient) -> None:
        r = await client.post(url + "/x", {})
        got: list[bytes] = []

        async def reader() -> None:
            async for chunk in r.aiter_raw():
                got.append(chunk)

        task = asyncio.create_task(reader())
        await asyncio.sleep(0.1)
        assert got == [b"hi"] and not task.done()
        r.close()
        await asyncio.wait_for(task, 1)
        await asyncio.wait_for(seen_eof.wait(), 2)

    run(handler, body)


def test_big_reply_is_read_whole_through_pause_and_resume() -> None:
    """A reply larger than HIGH_WATER, read slowly: the socket is paused while the unread
    body is above it and resumed when it is taken; every byte arrives in order."""
    blob = bytes(range(256)) * 4096  # 1 MiB

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(blob))
        w.write(blob)
        await w.drain()

    async def body(url: str, client: BackendClient) -> None:
        r = await client.post(url + "/x", {})
        await asyncio.sleep(0.2)  # the whole reply is sent before anything is read
        assert r._paused
        got = b"".join([chunk async for chunk in r.aiter_raw()])
        assert got == blob and not r._paused

    run(handler, body)


def test_request_writes_method_query_and_headers_but_never_a_smuggled_line() -> None:
    """`request` (the split router's relay): any method, the query kept, the caller's
    headers passed on, a header with CR/LF dropped; a GET without a body has no
    Content-Length."""
    heads: list[str] = []

    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = (await r.readuntil(b"\r\n\r\n")).decode()
            except asyncio.IncompleteReadError:
                return
            heads.append(head)
            fields = dict(f.split(": ", 1) for f in head.split("\r\n")[1:] if f)
            body = await r.readexactly(int(fields.get("Content-Length", 0)))
            w.write(b"HTTP/1.1 201 Created\r\nx-echo: %s\r\ncontent-length: %d\r\n\r\n%s"
                    % (head.split("\r\n")[0].encode(), len(body), body))
            await w.drain()

    async def body(url: str, client: BackendClient) -> None:
        r = await client.request("GET", url + "/v1/models?a=1&b=2",
                                 headers=[("X-Ok", "1"), ("X-Bad", "v\r\nX-Injected: 1")])
        assert (r.status_code, r.headers["x-echo"], await r.aread()) == (
            201, "GET /v1/models?a=1&b=2 HTTP/1.1", b"")
        r = await client.request("POST", url + "/x", b"raw bytes", [("Content-Type", "a/b")])
        assert r.status_code == 201 and await r.aread() == b"raw bytes"
        # a decoded %0D%0A in a path never ends the request line: urlsplit drops CR / LF
        # (as WHATWG URLs do), a space is encoded, an escape already there stays
        r = await client.request("GET", url + "/a b\r\nX-Injected: 1\r\n\r\nGET /c%41")
        assert r.headers["x-echo"] == "GET /a%20bX-Injected:%201GET%20/c%41 HTTP/1.1"
        await r.aread()

    run(echo, body)
    assert len(heads) == 3 and "X-Injected" not in heads[2].split("\r\n", 1)[1]
    assert "X-Ok: 1\r\n" in heads[0] and "Injected" not in heads[0] and "X-Bad" not in heads[0]
    assert "Content-Length" not in heads[0] and "Content-Length: 9\r\n" in heads[1]
    assert "Content-Type: a/b\r\n" in heads[1] and "Authorization" not in heads[1]
