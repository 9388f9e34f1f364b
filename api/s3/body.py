"""Request bodies of the S3 API, read as they arrive and checked against what the request
claims.

Contract:
- `receive_object` streams an object's body (PutObject, UploadPart) into a file in chunks,
  never holding it in memory, and stops with EntityTooLarge past `limit` bytes. The
  `x-amz-content-sha256` header says how the body comes: a hex SHA-256 (checked at the end:
  XAmzContentSHA256Mismatch), UNSIGNED-PAYLOAD (and every presigned URL), or aws-chunked
  (`STREAMING-*`: decoded here; each chunk's signature is checked for the signed forms, a
  trailing checksum for the trailer forms). Content-MD5 and `x-amz-checksum-crc32`,
  `-sha1`, `-sha256` (header or trailer) are checked (BadDigest); other checksum
  algorithms are accepted unchecked. A body shorter than its declared length, or cut by a
  disconnect before its end (a chunked body's last chunk, aws-chunked's final chunk), is
  IncompleteBody: a body that did not all arrive is never taken for a whole one.
  `on_bytes(n)` is called as each piece arrives, before it is written (the quota:
  api/s3/quota.py Meter.add, which may refuse it). On any failure the file is removed.
- `read_small` reads an XML body (CompleteMultipartUpload, DeleteObjects, CreateBucket)
  up to Settings.max_request_bytes (api/edge/bounded.py), checking its SHA-256 the same way.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from eaglenest.api.edge.bounded import declared_length
from eaglenest.api.edge.sigv4 import Claim, chunk_signature
from eaglenest.api.s3.errors import S3Error
from eaglenest.api.s3.request import S3Request

UNSIGNED = "UNSIGNED-PAYLOAD"
SIGNED_STREAMING = ("STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
                    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER")
UNSIGNED_STREAMING = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
_MAX_LINE = 8192
_CHUNK_SIZE = re.compile(r"^[0-9a-fA-F]{1,16}$")


class AwsChunked:
    """Decoder of an aws-chunked body: `hex-size[;chunk-signature=sig]\\r\\n data \\r\\n`
    ... `0[;chunk-signature=sig]\\r\\n`, then trailer lines `name:value\\r\\n` and an empty
    line. With a claim, every chunk's signature must chain from the request's."""

    def __init__(self, claim: Claim | None, resource: str) -> None:
        self.claim, self.resource = claim, resource
        self.previous = claim.signature if claim else ""
        self.buf = bytearray()
        self.state = "size"  # size -> data -> crlf -> size ... -> trailer -> done
        self.left = 0
        self.signature = ""
        self.chunk = hashlib.sha256()
        self.trailers: dict[str, str] = {}

    def _bad(self, why: str) -> S3Error:
        return S3Error("IncompleteBody", f"aws-chunked body: {why}", self.resource)

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The payload bytes `data` completes, in order."""
        self.buf += data
        while True:
            if self.state == "data":
                if not self.buf:
                    return
                piece = bytes(self.buf[:self.left])
                del self.buf[:len(piece)]
                self.left -= len(piece)
                self.chunk.update(piece)
                if self.left == 0:
                    self.state = "crlf"
                yield piece
            elif self.state == "crlf":
                if len(self.buf) < 2:
                    return
                if self.buf[:2] != b"\r\n":
                    raise self._bad("a chunk does not end with CRLF")
                del self.buf[:2]
                self._chunk_done()
                self.state = "size"
            elif not self._line():
                return

    def _line(self) -> bool:
        """Consume one size or trailer line; False when it has not all arrived yet."""
        end = self.buf.find(b"\r\n")
        if end < 0:
            if len(self.buf) > _MAX_LINE:
                raise self._bad("a chunk header or trailer line is too long")
            return False
        line = bytes(self.buf[:end]).decode("latin-1")
        del self.buf[:end + 2]
        if self.state == "trailer":
            self._trailer(line)
        elif self.state == "size":
            self._size(line)
        else:
            raise self._bad("data after the end of the body")
        return True

    def _size(self, line: str) -> None:
        size, _, ext = line.partition(";")
        if _CHUNK_SIZE.match(size.strip()) is None:
            raise self._bad(f"bad chunk size {size[:20]!r}")
        self.left = int(size, 16)
        self.signature = ext.removeprefix("chunk-signature=").strip()
        self.chunk = hashlib.sha256()
        if self.left == 0:
            self._chunk_done()
            self.state = "trailer"
        else:
            self.state = "data"

    def _trailer(self, line: str) -> None:
        if not line:
            self.state = "done"
            return
        name, _, value = line.partition(":")
        if name.strip().lower() != "x-amz-trailer-signature":
            self.trailers[name.strip().lower()] = value.strip()

    def _chunk_done(self) -> None:
        if self.claim is None:
            return
        digest = self.chunk.hexdigest()
        expected = chunk_signature(self.claim, self.previous, digest)
        if self.signature != expected:
            raise S3Error("SignatureDoesNotMatch", "The chunk signature we calculated does "
                          "not match the signature you provided.", self.resource)
        self.previous = expected

    def finish(self) -> dict[str, str]:
        """The trailers; IncompleteBody unless the body ended where it should."""
        if self.state != "done" and not (self.state == "trailer" and not self.buf):
            raise self._bad("the body ended before its last chunk")
        return self.trailers


class Checks:
    """The digests a body must match: its SHA-256 (hex, from x-amz-content-sha256),
    Content-MD5, and the x-amz-checksum-* it names (header now, or trailer later)."""

    def __init__(self, headers: dict[str, str], resource: str) -> None:
        self.resource = resource
        mode = headers.get("x-amz-content-sha256", UNSIGNED)
        self.sha256_hex = mode if len(mode) == 64 else None
        self.hashers: dict[str, Any] = {}
        if self.sha256_hex:
            self.hashers["sha256"] = hashlib.sha256()
        self.md5 = headers.get("content-md5")
        if self.md5:
            self.hashers["md5"] = hashlib.md5(usedforsecurity=False)
        self.crc32 = 0
        self.wanted = {k: v for k, v in headers.items() if k.startswith("x-amz-checksum-")}
        named = headers.get("x-amz-trailer", "").lower()
        for name in [*self.wanted, named]:
            algo = name.removeprefix("x-amz-checksum-")
            if algo in ("sha1", "sha256") and algo not in self.hashers:
                self.hashers[algo] = hashlib.new(algo)

    def update(self, data: bytes) -> None:
        for h in self.hashers.values():
            h.update(data)
        self.crc32 = zlib.crc32(data, self.crc32)

    def verify(self, trailers: dict[str, str]) -> None:
        if self.sha256_hex and self.hashers["sha256"].hexdigest() != self.sha256_hex:
            raise S3Error("XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' "
                          "header does not match what was computed.", self.resource)
        if self.md5 and base64.b64encode(self.hashers["md5"].digest()).decode() != self.md5:
            raise S3Error("BadDigest", "The Content-MD5 you specified did not match what we "
                          "received.", self.resource)
        for name, value in {**self.wanted, **trailers}.items():
            actual = self._digest(name.removeprefix("x-amz-checksum-"))
            if actual is not None and actual != value:
                raise S3Error("BadDigest", f"The {name} you specified did not match the "
                              "calculated checksum.", self.resource)

    def _digest(self, algo: str) -> str | None:
        if algo == "crc32":
            return base64.b64encode(self.crc32.to_bytes(4, "big")).decode()
        if algo in ("sha1", "sha256") and algo in self.hashers:
            return base64.b64encode(self.hashers[algo].digest()).decode()
        return None  # crc32c, crc64nvme: accepted unchecked


def _mode(req: S3Request) -> str:
    if req.claim.presigned:
        return UNSIGNED
    mode = req.headers.get("x-amz-content-sha256", "")
    known = (UNSIGNED, UNSIGNED_STREAMING, *SIGNED_STREAMING)
    if len(mode) == 64 and all(c in "0123456789abcdef" for c in mode) or mode in known:
        return mode
    raise S3Error("InvalidArgument", "x-amz-content-sha256 must be a hex SHA-256, "
                  "UNSIGNED-PAYLOAD or a STREAMING-* value.", req.resource)


async def _chunks(req: S3Request) -> AsyncIterator[bytes]:
    """The body's chunks as they arrive; IncompleteBody when the client disconnects before
    its last one."""
    while True:
        message = await req.receive()
        if message["type"] == "http.disconnect":
            raise S3Error("IncompleteBody", "The connection closed before the request body "
                          "ended.", req.resource)
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def _decoded(req: S3Request) -> AsyncIterator[bytes]:
    mode = _mode(req)
    chunks = _chunks(req)
    if not mode.startswith("STREAMING-"):
        async for chunk in chunks:
            yield chunk
        return
    decoder = AwsChunked(req.claim if mode in SIGNED_STREAMING else None, req.resource)
    async for chunk in chunks:
        for piece in decoder.feed(chunk):
            yield piece
    trailers = decoder.finish()
    req.headers.update({f"trailer:{k}": v for k, v in trailers.items()})


def expected_size(req: S3Request) -> int | None:
    """The payload's declared size (aws-chunked: x-amz-decoded-content-length), if any."""
    decoded = req.headers.get("x-amz-decoded-content-length", "")
    if decoded:
        return int(decoded) if decoded.isascii() and decoded.isdigit() and \
            len(decoded) <= 19 else None
    mode = req.headers.get("x-amz-content-sha256", "")
    return None if mode.startswith("STREAMING-") else declared_length(req.headers)


async def receive_object(req: S3Request, dest: Path, limit: int,
                         on_bytes: Callable[[int], None] | None = None) -> int:
    """Write the body into `dest` (module docstring); its size."""
    expected = expected_size(req)
    if expected is not None and expected > limit:
        raise S3Error("EntityTooLarge", f"Your proposed upload exceeds the maximum allowed "
                      f"size ({limit} bytes).", req.resource)
    checks, size = Checks(req.headers, req.resource), 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with dest.open("wb") as fh:
            async for piece in _decoded(req):
                size += len(piece)
                if size > limit:
                    raise S3Error("EntityTooLarge", "Your proposed upload exceeds the "
                                  f"maximum allowed size ({limit} bytes).", req.resource)
                if on_bytes is not None:
                    on_bytes(len(piece))
                checks.update(piece)
                fh.write(piece)
        if expected is not None and size != expected:
            raise S3Error("IncompleteBody", f"You did not provide the number of bytes "
                          f"specified ({size} of {expected}).", req.resource)
        checks.verify({k[8:]: v for k, v in req.headers.items() if k.startswith("trailer:")})
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return size


async def read_small(req: S3Request) -> bytes:
    """A small (XML) body, at most Settings.max_request_bytes (module docstring)."""
    limit = req.settings.max_request_bytes
    declared = declared_length(req.headers)
    if declared is not None and declared > limit:
        raise S3Error("EntityTooLarge", f"The request body exceeds {limit} bytes.",
                      req.resource)
    checks, parts, size = Checks(req.headers, req.resource), [], 0
    async for piece in _decoded(req):
        size += len(piece)
        if size > limit:
            raise S3Error("EntityTooLarge", f"The request body exceeds {limit} bytes.",
                          req.resource)
        checks.update(piece)
        parts.append(piece)
    checks.verify({})
    return b"".join(parts)
