"""Plain-ASGI edges both planes share: reading a request body and sending a whole reply.

The API's own ASGI layers (api/runtime/proxy.py, api/s3/), the model servers' guard
(foundation/http/instance_auth.py) and the split router
(workers/model_servers/split_router.py) answer below FastAPI, so they read and reply
through these, never through copies of their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

from starlette.types import Receive, Send

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


async def reply(send: Send, status: int, body: bytes, content_type: bytes = b"text/plain",
                headers: Headers = ()) -> None:
    """One complete response: status, content type and length, `headers`, the body."""
    start: dict[str, Any] = {"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type), (b"content-length", str(len(body)).encode()),
        *headers]}
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})
