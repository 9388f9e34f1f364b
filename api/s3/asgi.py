"""The S3 API as a plain ASGI layer ahead of everything else of the app (the runtime's
layer, FastAPI's router): a request api/s3/routing.py takes for S3's is answered here,
any other goes on. Errors are S3's XML (api/s3/errors.py); a HEAD's carry no body.

An object's body is streamed from its file a `BLOCK` at a time, the next block read only
once the last one left our buffer, so a reply the client does not read costs about one
block of memory until the send timeout resets it (foundation/http/connections.py), and a reply
to a caller gone away stops being read from disk."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from typing import BinaryIO

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eaglenest.api.edge.keyring import KeyRing
from eaglenest.api.edge.sigv4 import SignedRequest
from eaglenest.api.s3 import routing
from eaglenest.api.s3.errors import S3Error, from_auth, from_storage
from eaglenest.api.s3.request import Reply, S3Request
from eaglenest.api.s3.store_access import run
from eaglenest.foundation.errors import ServiceError
from eaglenest.foundation.http.asgi import reply, start
from eaglenest.foundation.settings import Settings
from eaglenest.foundation.store.buckets import AccountStore
from eaglenest.foundation.store.storage import BucketStore, StorageError

log = logging.getLogger("eaglenest.s3")
#: the bytes of an object read from disk at a time, and so about the most a reply holds
#: in memory while its client does not read (1024 unread replies: a quarter of a GiB)
BLOCK = 256 * 1024
#: an empty part of a body: uvicorn's send() waits until our buffer has drained below its
#: low-water mark before writing anything (or returns at once, the client gone)
_DRAINED = {"type": "http.response.body", "body": b"", "more_body": True}


class BodyTracker:
    """The request's `receive`, remembering whether the body was read to its end."""

    #: an unread rest up to this size is read and dropped (the connection stays open)
    DRAIN = 64 * 1024

    def __init__(self, receive: Receive, headers: Mapping[str, str]) -> None:
        self._receive = receive
        length = headers.get("content-length", "0")
        chunked = "chunked" in headers.get("transfer-encoding", "")
        self.left = -1 if chunked else int(length) if length.isdigit() else 0
        self.done = self.left == 0

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.done = True
        elif self.left > 0:
            self.left -= len(message.get("body", b""))
        return message

    async def drained(self) -> bool:
        """True when the body is read, reading a small rest; False: close the connection."""
        if self.done:
            return True
        if not 0 <= self.left <= self.DRAIN:
            return False
        while not self.done:
            await self.receive()
        return True


class S3ASGI:
    """Answers the S3 API's requests (api/s3/routing.py is_s3); passes any other on."""

    def __init__(self, app: ASGIApp, store: BucketStore, settings: Settings,
                 keyring: KeyRing) -> None:
        self.app, self.store, self.settings, self.keyring = app, store, settings, keyring

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        signed = SignedRequest.of(scope, path_as_sent=True)
        headers = dict(signed.headers)  # S3Request's: trailers join it (api/s3/body.py)
        query = routing.query_of(scope)
        if not routing.is_s3(scope, headers, query):
            await self.app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex[:16].upper()
        body = BodyTracker(receive, headers)
        answer = await self._answer(scope, signed, body.receive, headers, query)
        if not await body.drained():
            # the rest of an unread body would be read as the next request: close instead
            answer.headers["connection"] = "close"
            receive = _never_told
        await _send(send, answer, scope["method"] == "HEAD", request_id, receive)

    async def _answer(self, scope: Scope, signed: SignedRequest, receive: Receive,
                      headers: dict[str, str], query: dict[str, str]) -> Reply | S3Error:
        resource = str(scope.get("path", "/"))
        try:
            keys = self.keyring.current()
            try:
                claim = routing.authenticate(signed, query,
                                             {k: v.secret for k, v in keys.items()},
                                             self.settings)
            except ServiceError as exc:
                return from_auth(exc, resource)
            bucket, key = routing.split_path(scope)
            req = S3Request(scope["method"], bucket, key, query, headers, claim,
                            AccountStore(self.store, keys[claim.access_key].account_id),
                            receive, self.settings)
            resource = req.resource
            return await routing.handler(req.method, bucket, key, query, resource)(req)
        except S3Error as exc:
            return exc
        except StorageError as exc:
            return from_storage(exc, resource)
        except UnicodeDecodeError:
            return S3Error("InvalidURI", "Couldn't parse the specified URI.", resource)
        except Exception:
            log.exception("S3 %s %s failed", scope["method"], resource)
            return S3Error("InternalError", "We encountered an internal error. Please try "
                           "again.", resource)


def _headers(request_id: str, extra: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    out = [(b"x-amz-request-id", request_id.encode())]
    out += [(k.encode(), v.encode("latin-1", "replace")) for k, v in extra.items()]
    return out


async def _never_told() -> Message:
    """A `receive` for a request whose body is not all read: the rest is not the
    disconnect a streamed reply watches for, so it is not read to find it."""
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def _send(send: Send, answer: Reply | S3Error, head: bool, request_id: str,
                receive: Receive) -> None:
    """The reply, through the writer of every plane (foundation.http.asgi); a HEAD's
    without its body (its content-length is the object's). A streamed one ends early when
    `receive` says the client is gone."""
    if isinstance(answer, S3Error):
        answer = Reply(answer.status, answer.xml(request_id),
                       {**answer.headers, "content-type": "application/xml"})
    stream = answer.stream
    length = answer.length if stream is not None or (head and answer.length) else \
        len(answer.body)
    extra = dict(answer.headers)
    content_type = extra.pop("content-type", None)
    kind = None if content_type is None else content_type.encode("latin-1", "replace")
    out = _headers(request_id, extra)
    if head or stream is None:
        if stream is not None:
            stream.close()
        await reply(send, answer.status, b"" if head else answer.body, kind, out, length)
        return
    await start(send, answer.status, kind, length, out)
    gone = asyncio.ensure_future(_disconnect(receive))
    try:
        await _stream(send, answer.length, stream, gone)
    finally:
        gone.cancel()
        stream.close()


async def _disconnect(receive: Receive) -> None:
    """Returns once the client is gone (or the reply is complete)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _stream(send: Send, left: int, reader: BinaryIO, gone: asyncio.Future[None]
                  ) -> None:
    """`left` bytes of `reader`, block by block, each read in a worker thread once the
    last one is out of our buffer; none once the client is gone."""
    while left > 0:
        await send(_DRAINED)
        if gone.done():
            return  # the connection is gone, and with it the rest of the reply
        left -= await _send_block(send, reader, min(BLOCK, left), left)


async def _send_block(send: Send, reader: BinaryIO, size: int, left: int) -> int:
    """One block of `size` of the `left` bytes still to send (its own frame: the block is
    not kept past the send, so our buffer holds the only copy while the client reads)."""
    block = await run(reader.read, size)
    if len(block) != size:
        raise OSError("the object was cut short while it was read")
    await send({"type": "http.response.body", "body": block, "more_body": left > size})
    return size
