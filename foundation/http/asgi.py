"""Plain-ASGI edges every plane shares: reading a request body and writing a reply.

The API's own ASGI layers (api/runtime/proxy.py, api/s3/), the model servers' guard
(foundation/http/instance_auth.py) and the split router
(workers/model_servers/split_router.py) answer below FastAPI, so they read and reply
through these, never through copies of their own; FastAPI's routes (`POST /`) return a
`WholeReply`, written by the same `reply`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

Headers = Iterable[tuple[bytes, bytes]]


async def body_chunks(receive: Receive) -> AsyncIterator[bytes]:
    """A request's body chunks as they arrive (ends at its last chunk or a disconnect)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def read_body(receive: Receive) -> bytes:
    """The whole body (what arrived before a disconnect). Unbounded: a server whose only
    caller is our own proxy, which bounded it already (api.edge.bounded for what callers send)."""
    return b"".join([chunk async for chunk in body_chunks(receive)])


async def start(send: Send, status: int, content_type: bytes | None, length: int | None,
                headers: Headers = ()) -> None:
    """A response's status and headers: its content type and length (each left out when
    None: a stream's length is not known, some replies have no type), then `headers`."""
    out = [] if content_type is None else [(b"content-type", content_type)]
    if length is not None:
        out.append((b"content-length", str(length).encode()))
    await send({"type": "http.response.start", "status": status,
                "headers": [*out, *headers]})


async def reply(send: Send, status: int, body: bytes,
                content_type: bytes | None = b"text/plain", headers: Headers = (),
                length: int | None = None) -> None:
    """One complete response, the one writer of every plane (api/edge/json_protocol.py
    through `WholeReply`, api/runtime/proxy.py, api/s3/asgi.py) and of the model servers'
    guards: status, content type and length, `headers`, the body. `length`: another
    than the body's (a HEAD's, whose body is left out)."""
    await start(send, status, content_type, len(body) if length is None else length, headers)
    await send({"type": "http.response.body", "body": body, "more_body": False})


def amzn_request_id() -> tuple[bytes, bytes]:
    """A fresh x-amzn-RequestId, on every reply of SageMaker's planes (S3's is its own)."""
    return b"x-amzn-requestid", str(uuid.uuid4()).encode()


class WholeReply(Response):
    """A FastAPI route's reply written by `reply`: the same bytes as a plain-ASGI plane's."""

    def __init__(self, status: int, body: bytes, content_type: bytes,
                 headers: Headers = ()) -> None:
        self.extra = list(headers)
        super().__init__(body, status, {k.decode("latin-1"): v.decode("latin-1")
                                        for k, v in self.extra},
                         content_type.decode("latin-1"))
        self.content_type, self.payload = content_type, body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await reply(send, self.status_code, self.payload, self.content_type, self.extra)
