"""Raw S3 requests for the tests: signed with botocore's S3 signer (any payload hash
declared), sent with http.client so the path goes out exactly as written."""

from __future__ import annotations

import http.client
from dataclasses import dataclass
from urllib.parse import urlsplit

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.support.stack import ACCESS_KEY, REGION, SECRET_KEY, Stack


class DeclaredPayload(S3SigV4Auth):
    """Signs with the x-amz-content-sha256 the test declares, not the body's hash."""

    def __init__(self, payload: str, secret: str = SECRET_KEY) -> None:
        super().__init__(Credentials(ACCESS_KEY, secret), "s3", REGION)
        self.declared = payload

    def payload(self, request: AWSRequest) -> str:
        return self.declared


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str]


def send(stack: Stack, method: str, path: str, body: bytes = b"",
         headers: dict[str, str] | None = None, payload: str | None = None,
         signed: bool = True) -> tuple[Answer, AWSRequest]:
    """`method path` with `body`; `payload`: the x-amz-content-sha256 to sign (default: the
    body's hash). Returns the answer and the signed request (its signature and date)."""
    req = AWSRequest(method=method, url=f"{stack.url}{path}", data=body,
                     headers=dict(headers or {}))
    if signed:
        if payload is None:
            S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", REGION).add_auth(req)
        else:
            DeclaredPayload(payload).add_auth(req)
    url = urlsplit(stack.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", url.netloc)
        for name, value in req.headers.items():
            if name.lower() != "host":
                conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        return Answer(r.status, r.read(), {k.lower(): v for k, v in r.getheaders()}), req
    finally:
        conn.close()
