"""A lean HTTP/1.1 client for the runtime proxy's hop to the model servers.

The hop is the proxy's per-token cost: every streamed token is one chunk read here and one
frame written to the caller. httpx parses responses in pure Python (h11) under anyio
cancel scopes, about as much work per chunk again as the rest of the proxy; this client
reads with asyncio streams and parses with httptools (C), keeps connections alive per
server, and does nothing else: POST with a JSON body, status, headers, body chunks.

Errors: `BackendConnectError` when the server refused the connection (the request never
reached it, so another instance may take it), `BackendError` for anything after that.
A pooled connection the server closed while idle is retried once on a fresh connection
when it failed before any byte of the response came back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httptools

READ_SIZE = 1 << 16


class BackendError(Exception):
    pass


class BackendConnectError(BackendError):
    pass


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()


class BackendResponse:
    """One response; its body is read on demand (`aiter_raw`, `aiter_lines`, `aread`)."""

    def __init__(self, client: BackendClient, key: tuple[str, int], conn: _Conn,
                 read_timeout: float) -> None:
        self._client, self._key, self._conn = client, key, conn
        self._timeout = read_timeout
        self._chunks: list[bytes] = []
        self._complete = False
        self._keep_alive = True
        self._closed = False
        self.status_code = 0
        self.headers: dict[str, str] = {}
        self._parser = httptools.HttpResponseParser(self)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status_code = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        self._complete = True

    async def _feed(self) -> bool:
        """Read once from the socket into the parser; False at end of stream."""
        async with asyncio.timeout(self._timeout):
            data = await self._conn.reader.read(READ_SIZE)
        if not data:
            return False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise BackendError(f"bad response from the model server: {exc}") from exc
        return True

    async def read_head(self) -> None:
        while not self.status_code:
            if not await self._feed():
                raise BackendError("the model server closed the connection without a reply")

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        try:
            while True:
                if self._chunks:
                    chunks, self._chunks = self._chunks, []
                    for chunk in chunks:
                        yield chunk
                if self._complete:
                    break
                if not await self._feed():
                    if not self._complete and self.headers.get("content-length") is not None:
                        raise BackendError("the model server closed the connection mid-reply")
                    self._keep_alive = False
                    break
        except (OSError, TimeoutError) as exc:
            raise BackendError(f"reading from the model server failed: {exc!r}") from exc
        await self.aclose()

    async def aiter_lines(self) -> AsyncIterator[str]:
        pending = b""
        async for chunk in self.aiter_raw():
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode()
        if pending:
            yield pending.decode()

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._complete and self._keep_alive:
            self._client._release(self._key, self._conn)
        else:
            self._conn.close()


class BackendClient:
    """POSTs JSON to model servers over kept-alive connections (a pool per server)."""

    def __init__(self, connect_timeout: float = 5.0, read_timeout: float = 600.0,
                 max_idle_per_server: int = 32) -> None:
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.max_idle = max_idle_per_server
        self._idle: dict[tuple[str, int], list[_Conn]] = {}

    async def _connect(self, key: tuple[str, int]) -> _Conn:
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(*key)
        except (OSError, TimeoutError) as exc:
            raise BackendConnectError(f"cannot connect to {key[0]}:{key[1]}: {exc!r}") from exc
        return _Conn(reader, writer)

    def _release(self, key: tuple[str, int], conn: _Conn) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) < self.max_idle and not conn.writer.is_closing():
            idle.append(conn)
        else:
            conn.close()

    async def post(self, url: str, body: Any) -> BackendResponse:
        """Send the request and read the status line and headers; the body stays unread."""
        parts = urlsplit(url)
        key = (parts.hostname or "127.0.0.1", parts.port or 80)
        payload = json.dumps(body).encode()
        head = (f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                "Accept: */*\r\n\r\n").encode()
        idle = self._idle.get(key)
        pooled = idle.pop() if idle else None
        conn = pooled or await self._connect(key)
        try:
            return await self._exchange(key, conn, head + payload)
        except (BackendError, OSError, TimeoutError) as exc:
            conn.close()
            if pooled is None or isinstance(exc, TimeoutError):
                raise BackendError(f"the model server failed: {exc!r}") from exc
        # the server had closed the idle pooled connection: once more on a fresh one
        fresh = await self._connect(key)
        try:
            return await self._exchange(key, fresh, head + payload)
        except (BackendError, OSError, TimeoutError) as exc:
            fresh.close()
            raise BackendError(f"the model server failed: {exc!r}") from exc

    async def _exchange(self, key: tuple[str, int], conn: _Conn,
                        request: bytes) -> BackendResponse:
        conn.writer.write(request)
        await conn.writer.drain()
        response = BackendResponse(self, key, conn, self.read_timeout)
        await response.read_head()
        return response

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
