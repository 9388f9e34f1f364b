"""Bounded inputs: a request body is read only up to a limit (and only once its signature
header passed: api.edge.sigv4.check_header), and JSON is parsed only up to a nesting depth.

Limits: the control plane takes at most `Settings.max_request_bytes` (8 MiB by default: the
largest valid SageMaker request, CreateModel with 15 containers of 100 Environment entries
of 1 KiB name and value, is about 3.2 MB); sagemaker-runtime takes SageMaker's 6 MB
(api.runtime.checks.MAX_BODY). JSON nests at most `MAX_JSON_DEPTH` deep (SageMaker's
shapes nest fewer than 10 levels); deeper is a SerializationException, never a recursion
error.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace

from eaglenest.api.edge.sigv4 import (
    REQUIRED,
    SERVICE,
    SignedRequest,
    Verified,
    check_header,
    check_signature,
)
from eaglenest.foundation.errors import SerializationException, ServiceError

MAX_JSON_DEPTH = 64
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class RequestTooLarge(ServiceError):
    """A control-plane body over the limit: 413, before more of it is read."""

    code = "ValidationException"
    status = 413


def declared_length(headers: Mapping[str, str]) -> int | None:
    try:
        return int(headers.get("content-length", ""))
    except ValueError:
        return None


async def read_capped(chunks: AsyncIterator[bytes], limit: int) -> bytes | None:
    """The body, or None as soon as more than `limit` bytes arrived (the rest unread)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


@dataclass(frozen=True)
class BodyLimit:
    """The most bytes of a body a plane reads, and its own error for more."""

    size: int
    too_large: Callable[[], ServiceError]


async def read_signed(req: SignedRequest, chunks: AsyncIterator[bytes], limit: BodyLimit,
                      secrets: Mapping[str, str], region: str, max_skew: int,
                      service: str = SERVICE, required: tuple[str, ...] = REQUIRED
                      ) -> tuple[bytes, Verified]:
    """The body of a request whose signature is valid, and who signed it. The Authorization
    header is checked first and the body read only up to `limit.size` (a declared length
    over it is refused unread): an unsigned or oversized request costs no body. The one
    path of both planes (the control plane's POST /, sagemaker-runtime)."""
    claim = check_header(req.headers, secrets, region, max_skew, service, required)
    declared = declared_length(req.headers)
    if declared is not None and declared > limit.size:
        raise limit.too_large()
    body = await read_capped(chunks, limit.size)
    if body is None:
        raise limit.too_large()
    return body, check_signature(replace(req, body=body), claim)


def too_large(limit: int) -> RequestTooLarge:
    return RequestTooLarge(
        f"Request body is larger than {limit} bytes, the most this service accepts "
        "(EAGLENEST_MAX_REQUEST_BYTES).")


def check_depth(body: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """SerializationException when the JSON in `body` nests deeper than `limit` (strings,
    where brackets mean nothing, are skipped)."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if len(brackets) <= 2 * limit:
        return
    depth = 0
    for b in brackets:
        if b in b"[{":
            depth += 1
            if depth > limit:
                raise SerializationException(
                    f"Request body nests JSON deeper than {limit} levels.")
        else:
            depth -= 1
