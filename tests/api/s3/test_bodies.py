"""Request bodies as S3 clients send them, built by hand and sent raw: aws-chunked with a
trailing CRC32 (STREAMING-UNSIGNED-PAYLOAD-TRAILER, what botocore sends over HTTPS), signed
chunks (STREAMING-AWS4-HMAC-SHA256-PAYLOAD; the chunk signatures computed here, from the
SigV4 specification), a payload hash that does not match, a wrong CRC32."""

from __future__ import annotations

import base64
import hashlib
import hmac
import zlib
from typing import Any

import pytest

from tests.api.s3.raw import send
from tests.support.stack import REGION, SECRET_KEY, Stack

EMPTY = hashlib.sha256(b"").hexdigest()


def crc32(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def code(body: bytes) -> str:
    return body.split(b"<Code>")[1].split(b"</Code>")[0].decode()


@pytest.fixture(scope="module")
def target(stack: Stack, s3: Any) -> str:
    s3.create_bucket(Bucket="bodies")
    return "bodies"


def test_unsigned_trailer(stack: Stack, s3: Any, target: str) -> None:
    data = b"x" * 70000 + b"end"
    body = (f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n"
            + f"x-amz-checksum-crc32:{crc32(data)}\r\n\r\n".encode())
    headers = {"Content-Encoding": "aws-chunked", "x-amz-trailer": "x-amz-checksum-crc32",
               "x-amz-decoded-content-length": str(len(data))}
    answer, _ = send(stack, "PUT", f"/{target}/trailer", body, headers,
                     payload="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    assert answer.status == 200, answer.body
    assert s3.get_object(Bucket=target, Key="trailer")["Body"].read() == data
    bad = body.replace(crc32(data).encode(), crc32(b"other").encode())
    answer, _ = send(stack, "PUT", f"/{target}/trailer2", bad, headers,
                     payload="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    assert (answer.status, code(answer.body)) == (400, "BadDigest")
    cut = body[:1000]
    headers["x-amz-decoded-content-length"] = str(len(data))
    answer, _ = send(stack, "PUT", f"/{target}/trailer3", cut, headers,
                     payload="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    assert (answer.status, code(answer.body)) == (400, "IncompleteBody")
    assert "Contents" not in s3.list_objects_v2(Bucket=target, Prefix="trailer2")


def _key(date: str) -> bytes:
    k = hmac.new(f"AWS4{SECRET_KEY}".encode(), date.encode(), hashlib.sha256).digest()
    for part in (REGION, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k


def signed_chunks(chunks: list[bytes], amz_date: str, seed: str) -> bytes:
    key, previous, out = _key(amz_date[:8]), seed, b""
    scope = f"{amz_date[:8]}/{REGION}/s3/aws4_request"
    for chunk in [*chunks, b""]:
        text = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, previous, EMPTY,
                          hashlib.sha256(chunk).hexdigest()])
        previous = hmac.new(key, text.encode(), hashlib.sha256).hexdigest()
        out += f"{len(chunk):x};chunk-signature={previous}\r\n".encode() + chunk + b"\r\n"
    return out


def test_signed_chunks(stack: Stack, s3: Any, target: str) -> None:
    chunks = [b"a" * 65536, b"b" * 10]
    data = b"".join(chunks)
    headers = {"Content-Encoding": "aws-chunked",
               "x-amz-decoded-content-length": str(len(data))}
    # the body's chunk signatures chain from the request's own: sign, then build the body
    from botocore.awsrequest import AWSRequest

    from tests.api.s3.raw import DeclaredPayload

    req = AWSRequest(method="PUT", url=f"{stack.url}/{target}/signed", headers=headers)
    DeclaredPayload("STREAMING-AWS4-HMAC-SHA256-PAYLOAD").add_auth(req)
    seed = req.headers["Authorization"].rsplit("Signature=", 1)[1]
    body = signed_chunks(chunks, req.headers["X-Amz-Date"], seed)
    answer = _send_signed(stack, req, body)
    assert answer.status == 200, answer.body
    assert s3.get_object(Bucket=target, Key="signed")["Body"].read() == data
    tampered = body.replace(b"b" * 10, b"c" * 10)
    answer = _send_signed(stack, req, tampered)
    assert (answer.status, code(answer.body)) == (403, "SignatureDoesNotMatch")
    assert s3.get_object(Bucket=target, Key="signed")["Body"].read() == data


def _send_signed(stack: Stack, req: Any, body: bytes) -> Any:
    import http.client
    from urllib.parse import urlsplit

    from tests.api.s3.raw import Answer

    url = urlsplit(stack.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.request("PUT", urlsplit(req.url).path, body,
                     {k: v for k, v in req.headers.items()})
        r = conn.getresponse()
        return Answer(r.status, r.read(), {})
    finally:
        conn.close()


def test_payload_hash_mismatch(stack: Stack, s3: Any, target: str) -> None:
    answer, _ = send(stack, "PUT", f"/{target}/hash", b"the body",
                     payload=hashlib.sha256(b"another body").hexdigest())
    assert (answer.status, code(answer.body)) == (400, "XAmzContentSHA256Mismatch")
    answer, _ = send(stack, "PUT", f"/{target}/hash", b"the body",
                     headers={"x-amz-checksum-crc32": crc32(b"nope")})
    assert (answer.status, code(answer.body)) == (400, "BadDigest")
    answer, _ = send(stack, "PUT", f"/{target}/hash", b"the body",
                     headers={"x-amz-checksum-crc32": crc32(b"the body")})
    assert answer.status == 200
    answer, _ = send(stack, "PUT", f"/{target}/hash", b"x", payload="NOT-A-HASH")
    assert (answer.status, code(answer.body)) == (400, "InvalidArgument")


def test_unsigned_requests_route_to_s3(stack: Stack) -> None:
    """Unsigned: AccessDenied for anything but the API's own routes."""
    for method, path in (("GET", "/"), ("PUT", "/bodies/k"), ("GET", "/bodies")):
        answer, _ = send(stack, method, path, signed=False)
        assert (answer.status, code(answer.body)) == (403, "AccessDenied"), path
    answer, _ = send(stack, "GET", "/ping", signed=False)
    assert answer.status == 200
    answer, _ = send(stack, "POST", "/endpoints/e/invocations", b"{}", signed=False)
    assert answer.status == 403 and b"<Error>" not in answer.body  # sagemaker-runtime's
