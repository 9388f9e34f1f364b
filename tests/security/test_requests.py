"""Strict SigV4 and bounded inputs: the operation and body type must be signed, unsigned
and oversized requests are refused before their body is read (the API's memory stays
flat), deep JSON is a SerializationException, sagemaker-runtime takes SageMaker's 6 MB."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from eaglenest.api.edge.bounded import MAX_JSON_DEPTH
from eaglenest.api.runtime.checks import MAX_BODY
from tests.security.raw_http import api_process
from tests.support.stack import ACCESS_KEY, REGION, SECRET_KEY, Stack

CONTROL_LIMIT = 8 * 1024 * 1024
MIB = 1024 * 1024
#: how much the API process may grow while 300 MiB are thrown at it (one capped body)
RSS_CEILING = 48 * MIB


def signed_headers(url: str, body: bytes, headers: dict[str, str],
                   service: str = "sagemaker") -> dict[str, str]:
    req = AWSRequest(method="POST", url=url, data=body, headers=headers)
    SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), service, REGION).add_auth(req)
    return dict(req.headers.items())


def create_model_body(name: str) -> bytes:
    return json.dumps({"ModelName": name, "PrimaryContainer": {
        "Image": "eaglenest", "ModelDataUrl": "s3://models/x/"}}).encode()


def model_exists(sm, name: str) -> bool:  # type: ignore[no-untyped-def]
    return any(m["ModelName"] == name for m in sm.list_models(MaxResults=100)["Models"])


def test_unsigned_target_cannot_be_reaimed(stack: Stack, sm) -> None:  # type: ignore[no-untyped-def]
    """Sign only host and x-amz-date (an old SDK, a captured request), then add the target:
    refused with AWS's message, nothing created."""
    body = create_model_body("reaimed")
    headers = signed_headers(f"{stack.url}/", body, {})
    r = httpx.post(f"{stack.url}/", content=body, headers={
        **headers, "X-Amz-Target": "SageMaker.CreateModel",
        "Content-Type": "application/x-amz-json-1.1"})
    assert r.status_code == 403
    assert r.json() == {"__type": "InvalidSignatureException",
                        "message": "'X-Amz-Target' must be a 'SignedHeader' in the AWS "
                                   "Authorization."}
    assert not model_exists(sm, "reaimed")


def test_content_type_and_host_must_be_signed(stack: Stack, sm) -> None:  # type: ignore[no-untyped-def]
    body = create_model_body("unsigned-type")
    headers = signed_headers(f"{stack.url}/", body, {"X-Amz-Target": "SageMaker.CreateModel"})
    r = httpx.post(f"{stack.url}/", content=body,
                   headers={**headers, "Content-Type": "application/x-amz-json-1.1"})
    assert r.status_code == 403
    assert r.json()["message"] == ("'Content-Type' must be a 'SignedHeader' in the AWS "
                                   "Authorization.")
    headers = signed_headers(f"{stack.url}/", body, {
        "X-Amz-Target": "SageMaker.CreateModel", "Content-Type": "application/x-amz-json-1.1"})
    assert ";host;" in headers["Authorization"]
    headers["Authorization"] = headers["Authorization"].replace(";host;", ";")
    r = httpx.post(f"{stack.url}/", content=body, headers=headers)
    assert r.status_code == 403
    assert r.json()["message"] == "'Host' must be a 'SignedHeader' in the AWS Authorization."
    assert not model_exists(sm, "unsigned-type")


def _raw_post(url: str, path: str, head: dict[str, str], length: int, send: int) -> bytes:
    """POST declaring `length` bytes, send `send` of them, return what the server answers."""
    u = urlparse(url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as sock:
        lines = [f"POST {path} HTTP/1.1", f"Host: {u.netloc}", f"Content-Length: {length}",
                 *(f"{k}: {v}" for k, v in head.items()), "", ""]
        sock.sendall("\r\n".join(lines).encode())
        chunk = b"x" * MIB
        try:
            for _ in range(send // MIB):
                sock.sendall(chunk)
        except OSError:  # the server answered and closed: what a bounded server does
            pass
        sock.settimeout(10)
        reply = b""
        while b"\r\n\r\n" not in reply:
            data = sock.recv(65536)
            if not data:
                break
            reply += data
        return reply


@pytest.mark.parametrize("path", ["/", "/endpoints/any/invocations"])
def test_unsigned_gigabyte_is_refused_before_reading(stack: Stack, path: str) -> None:
    api = api_process(stack)
    before = api.memory_info().rss
    reply = _raw_post(stack.url, path, {"X-Amz-Target": "SageMaker.ListModels"}, 1 << 30,
                      64 * MIB)
    assert reply.startswith(b"HTTP/1.1 403"), reply[:200]
    assert api.memory_info().rss - before < RSS_CEILING


def _endless(total: int) -> Iterator[bytes]:
    chunk = b" " * MIB
    for _ in range(total // MIB):
        yield chunk


def test_streamed_body_over_the_limit_keeps_memory_flat(stack: Stack) -> None:
    """A validly signed header and a chunked body (no Content-Length) of 300 MiB: the API
    reads 8 MiB, answers 413 and its RSS stays within RSS_CEILING."""
    api = api_process(stack)
    before = api.memory_info().rss
    headers = signed_headers(f"{stack.url}/", b"{}", {
        "X-Amz-Target": "SageMaker.ListModels", "Content-Type": "application/x-amz-json-1.1"})
    headers.pop("Content-Length", None)
    peak = before
    try:
        r = httpx.post(f"{stack.url}/", content=_endless(300 * MIB), headers=headers,
                       timeout=60)
        status, body = r.status_code, r.json()
    except httpx.HTTPError:  # the server closed while we still sent: ask once more
        status, body = 413, None
    peak = max(peak, api.memory_info().rss)
    assert status == 413
    if body is not None:
        assert body == {"__type": "ValidationException", "message":
                        f"Request body is larger than {CONTROL_LIMIT} bytes, the most this "
                        "service accepts (EAGLENEST_MAX_REQUEST_BYTES)."}
    assert peak - before < RSS_CEILING


def test_declared_oversize_is_413(stack: Stack, signed_post) -> None:  # type: ignore[no-untyped-def]
    r = signed_post("SageMaker.ListModels", b" " * (CONTROL_LIMIT + 1))
    assert r.status_code == 413
    assert r.json()["__type"] == "ValidationException"


def test_deep_json_is_a_serialization_exception(signed_post) -> None:  # type: ignore[no-untyped-def]
    for opener, closer in (("[", "]"), ('{"a":', "}")):
        deep = b'{"ModelName":' + (opener * 1000).encode() + b"1" + (closer * 1000).encode() \
            + b"}"
        r = signed_post("SageMaker.DescribeModel", deep)
        assert r.status_code == 400, r.text
        assert r.json() == {"__type": "SerializationException", "message":
                            f"Request body nests JSON deeper than {MAX_JSON_DEPTH} levels."}
    # brackets inside strings are text, not nesting
    ok = signed_post("SageMaker.DescribeModel",
                     json.dumps({"ModelName": "[" * 5000}).encode())
    assert ok.json()["__type"] == "ValidationException"


def test_runtime_body_over_six_mb(stack: Stack) -> None:
    url = f"{stack.url}/endpoints/any/invocations"
    body = b" " * (MAX_BODY + 1)
    headers = signed_headers(url, body, {"Content-Type": "application/json"})
    t0 = time.monotonic()
    r = httpx.post(url, content=body, headers=headers, timeout=30)
    assert r.status_code == 413
    assert r.headers["x-amzn-errortype"] == "ValidationError"
    assert r.json() == {"message": "1 validation error detected: Value at 'body' failed to "
                                   "satisfy constraint: Member must have length less than or "
                                   f"equal to {MAX_BODY}"}
    assert time.monotonic() - t0 < 20


def test_proxy_read_timeout_is_sixty_seconds_and_configurable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from eaglenest.api.app import create_app
    from eaglenest.foundation.settings import Settings

    for env, want in (({}, 60.0), ({"invocation_timeout_seconds": 5.0}, 5.0)):
        settings = Settings(data_dir=tmp_path, **env)  # type: ignore[arg-type]
        app = create_app(settings, "redis://127.0.0.1:1/0")
        assert app.state.runtime_client.read_timeout == want
