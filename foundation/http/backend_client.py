"""A lean HTTP/1.1 client for the hop to the model servers: the runtime proxy's
(api/runtime) and the split router's (workers/model_servers/split_router.py).

The hop is the proxy's per-token cost: every streamed token is one chunk read here and one
frame written to the caller. httpx parses responses in pure Python (h11) under anyio
cancel scopes, about as much work per chunk again as the rest of the proxy. Here each
connection is an asyncio `Protocol` whose `data_received` feeds httptools (C) directly:
per chunk there is no StreamReader, no per-read timeout context and no task switch unless
the reader is actually waiting. The read timeout is one timer per response, re-armed only
when it fires early (a read that makes progress costs a float store, not a timer).

Errors: `BackendConnectError` when the server refused the connection (the request never
reached it, so another instance may take it), `BackendError` for anything after that.

Instances with a secret (foundation/http/instance_auth.py): a new connection is trusted only
after the server proved it knows the secret (a /health request with a challenge, before any
prompt is written to it); a server that cannot is a `BackendConnectError` like a refused
connection. Every request then carries the secret as a bearer token.
A pooled connection the server closed while idle is dropped when it is taken from the
pool; one that fails before any byte of the response came back is retried once on a fresh
connection.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any
from urllib.parse import quote, urlsplit

import httptools

from eaglenest.foundation.http import instance_auth

#: unread body bytes above which the socket stops being read (the caller is slower)
HIGH_WATER = 1 << 18
_UNSAFE = re.compile(r"[\r\n\0]")  # in a header: would end it and start another
_TARGET_SAFE = "/?#[]@!$&'()*+,;=:%~"  # RFC 3986 characters kept as they are


class BackendError(Exception):
    pass


class BackendConnectError(BackendError):
    pass


class BackendTimeout(BackendError):
    """The model server sent nothing for the read timeout (not retried: it may be busy)."""


class _Conn(asyncio.Protocol):
    """One kept-alive connection; bytes go to the response being read, if any."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.response: BackendResponse | None = None
        self.lost = False
        #: the instance secret this connection's server proved it knows, if any
        self.secret: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.response is None:  # bytes on an idle connection: it is unusable
            self.close()
            return
        self.response._data(data)

    def eof_received(self) -> bool:
        if self.response is not None:
            self.response._end(None)
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.response is not None:
            self.response._end(exc)

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class BackendResponse:
    """One response; its body is read on demand (`aiter_raw`, `aread`) or
    handed to a callback as it arrives (`stream_to`, then `finished`)."""

    def __init__(self, client: BackendClient, key: tuple[str, int], conn: _Conn,
                 read_timeout: float) -> None:
        self._client, self._key, self._conn = client, key, conn
        self._loop = asyncio.get_running_loop()
        self._timeout = read_timeout
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._complete = self._ended = self._closed = self._paused = False
        self._keep_alive = True
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        #: stream_to's callback: body chunks go there from data_received, not to _chunks
        self._sink: Callable[[bytes], None] | None = None
        self._held = False  # reading paused by hold() (the sink's consumer is slow)
        #: time.monotonic() of the request's sending and of the last bytes received (the
        #: read timeout's reference; uvloop's loop.time() has millisecond steps)
        self.sent_at = self.last_data_at = time.monotonic()
        self._timer = self._loop.call_later(read_timeout, self._check_idle)
        self.status_code = 0
        self.headers: dict[str, str] = {}
        self._parser = httptools.HttpResponseParser(self)
        conn.response = self

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status_code = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        if self._sink is not None:
            self._sink(body)
            return
        self._chunks.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        self._complete = True

    # protocol events
    def _data(self, data: bytes) -> None:
        self.last_data_at = time.monotonic()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._error = BackendError(f"bad response from the model server: {exc}")
        if self._buffered > HIGH_WATER and not self._paused and self._conn.transport:
            self._paused = True
            self._conn.transport.pause_reading()
        if self._sink is None or self._complete or self._error is not None:
            self._wake()  # a sink's reader waits for the end only: no task switch per chunk

    def _end(self, exc: Exception | None) -> None:
        self._ended = True
        if exc is not None and self._error is None and not self._complete:
            self._error = BackendError(f"reading from the model server failed: {exc!r}")
        self._wake()

    def _check_idle(self) -> None:
        """The read timeout's timer: fires once per `read_timeout`; re-armed from the last
        bytes received, so it only fails a reply that has been silent that long."""
        left = self.last_data_at + self._timeout - time.monotonic()
        if left > 0:
            self._timer = self._loop.call_later(left, self._check_idle)
            return
        if self._error is None:
            self._error = BackendTimeout(
                f"the model server sent nothing for {self._timeout:g} s (read timeout)")
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self) -> None:
        """Until new bytes, the end of the stream, an error or the read timeout."""
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _take(self) -> list[bytes]:
        chunks, self._chunks, self._buffered = self._chunks, [], 0
        if self._paused and self._conn.transport:
            self._paused = False
            self._conn.transport.resume_reading()
        return chunks

    async def read_head(self) -> None:
        while not self.status_code:
            if self._error is not None:
                raise self._error
            if self._ended:
                raise BackendError("the model server closed the connection without a reply")
            await self._wait()

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        while True:
            if self._chunks:
                for chunk in self._take():
                    yield chunk
            if self._complete or self._closed:
                break
            if self._error is not None:
                raise self._error
            if self._ended:
                self._ended_early()
                break
            await self._wait()
        self.close()

    def _ended_early(self) -> None:
        """The connection ended before the parser saw the reply's end: a failure unless the
        body runs until the close (neither Content-Length nor chunked)."""
        chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        if chunked or self.headers.get("content-length") is not None:
            raise BackendError("the model server closed the connection mid-reply")
        self._keep_alive = False

    def stream_to(self, sink: Callable[[bytes], None]) -> None:
        """Hand every body chunk to `sink` from now on, called inside the socket's
        `data_received` as the chunk arrives (no task switch per chunk); chunks already
        buffered go first, from here. `sink` must not raise. Then await `finished()`."""
        self._sink = sink
        for chunk in self._take():
            sink(chunk)

    def hold(self, held: bool) -> None:
        """Stop (True) or resume (False) reading from the model server: the sink's consumer
        cannot take more for now."""
        if held != self._held and self._conn.transport is not None and not self._conn.lost:
            if held:
                self._conn.transport.pause_reading()
            else:
                self._conn.transport.resume_reading()
        self._held = held

    async def finished(self) -> None:
        """With `stream_to`: until the reply has ended (or `close()` was called); raises
        the read's error as `aiter_raw` would. The connection is then released or closed."""
        async for _ in self.aiter_raw():  # the sink took every chunk: nothing comes here
            pass

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    def close(self) -> None:
        """Give the connection back to the pool when the reply was read to its end, else
        close it (the model server sees the caller go and stops generating)."""
        if self._closed:
            return
        self._closed = self._ended = True
        self._timer.cancel()
        self._wake()  # a reader waiting on this response stops
        self._conn.response = None
        if self._complete and self._keep_alive and self._error is None:
            self.hold(False)  # pooled connections are read again
            self._client._release(self._key, self._conn)
        else:
            self._conn.close()


class BackendClient:
    """Requests to model servers over kept-alive connections (a pool per server)."""

    def __init__(self, connect_timeout: float = 5.0, read_timeout: float = 600.0,
                 max_idle_per_server: int = 32) -> None:
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.max_idle = max_idle_per_server
        self._idle: dict[tuple[str, int], list[_Conn]] = {}

    async def _connect(self, key: tuple[str, int]) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(_Conn, *key)
        except (OSError, TimeoutError) as exc:
            raise BackendConnectError(f"cannot connect to {key[0]}:{key[1]}: {exc!r}") from exc
        return conn

    def _pooled(self, key: tuple[str, int], secret: str | None) -> _Conn | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.lost and conn.secret == secret:
                return conn
            conn.close()
        return None

    async def _trusted(self, key: tuple[str, int], netloc: str, secret: str | None) -> _Conn:
        """A new connection; with a secret, only once its server proved it knows it."""
        conn = await self._connect(key)
        if secret is None:
            return conn
        headers, expected = instance_auth.handshake(secret)
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = f"GET /health HTTP/1.1\r\nHost: {netloc}\r\n{lines}\r\n".encode()
        try:
            async with asyncio.timeout(self.connect_timeout):
                r = await self._exchange(key, conn, request)
                status = r.status_code
                proved = hmac.compare_digest(r.headers.get(instance_auth.PROOF, ""), expected)
                await r.aread()  # read to its end: the connection goes to the idle pool
        except (BackendError, TimeoutError) as exc:
            conn.close()
            raise BackendConnectError(f"{netloc} did not answer the instance check: "
                                      f"{exc!r}") from exc
        idle = self._idle.get(key, [])
        kept = conn in idle
        if kept:
            idle.remove(conn)  # this request's, not the pool's
        if status != 200 or not proved or not kept:
            conn.close()
            raise BackendConnectError(f"the process at {netloc} is not the instance EagleNest "
                                      f"started (no proof of its secret; status {status})")
        conn.secret = secret
        return conn

    def _release(self, key: tuple[str, int], conn: _Conn) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) < self.max_idle and not conn.lost:
            idle.append(conn)
        else:
            conn.close()

    async def post(self, url: str, body: Any, secret: str | None = None) -> BackendResponse:
        """POST `body` as JSON; see `request`."""
        return await self.request("POST", url, json.dumps(body).encode(),
                                  [("Content-Type", "application/json"), ("Accept", "*/*")],
                                  secret)

    async def request(self, method: str, url: str, body: bytes = b"",
                      headers: Iterable[tuple[str, str]] = (),
                      secret: str | None = None) -> BackendResponse:
        """Send the request and read the status line and headers; the body stays unread.
        `headers` must not hold Host, Content-Length, Transfer-Encoding or Authorization
        (set here); a header holding CR, LF or NUL is dropped, never written, and the URL's
        path and query are percent-encoded where they hold what a request line cannot.
        With `secret` (the instance's), only over a connection whose server proved it, and
        the request carries it as a bearer token."""
        parts = urlsplit(url)
        key = (parts.hostname or "127.0.0.1", parts.port or 80)
        # escapes stay as sent; what cannot stand in a request line is encoded here (a
        # space), or was dropped by urlsplit (CR, LF, tab: a decoded %0D%0A would start a
        # header)
        target = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                       safe=_TARGET_SAFE)
        lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}"]
        lines += [f"{k}: {v}" for k, v in headers if not _UNSAFE.search(k + v)]
        if body or method not in ("GET", "HEAD"):
            lines.append(f"Content-Length: {len(body)}")
        if secret:
            lines.append(f"Authorization: Bearer {secret}")
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        pooled = self._pooled(key, secret)
        conn = pooled or await self._trusted(key, parts.netloc, secret)
        try:
            return await self._exchange(key, conn, request)
        except BackendError as exc:
            if pooled is None or isinstance(exc, BackendTimeout):
                raise
        # the server had closed the idle pooled connection: once more on a fresh one
        return await self._exchange(key, await self._trusted(key, parts.netloc, secret),
                                    request)

    async def _exchange(self, key: tuple[str, int], conn: _Conn,
                        request: bytes) -> BackendResponse:
        response = BackendResponse(self, key, conn, self.read_timeout)
        try:
            if conn.lost or conn.transport is None:
                raise BackendError("the connection to the model server was closed")
            # the request is the model server's once written: on loopback the write hands it
            # over, and may wake the model server on this core, which can then run before
            # the write returns to us; that wait is not on the request's path, so `sent_at`
            # is taken before the write
            response.sent_at = time.monotonic()
            conn.transport.write(request)
            await response.read_head()
        except BaseException:  # a failure or a cancellation: the connection is unusable
            response.close()  # not read to its end: closes the connection
            raise
        return response

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
