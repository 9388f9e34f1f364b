"""Raw-socket clients of a real `eaglenest up` for the connection tests (tests/security/
test_connections.py): connections from loopback addresses of their own (127.0.0.2...:
Linux routes all of 127/8 to lo), signed requests written byte by byte, replies read (or
not read) as an attacker would, and what the API process holds meanwhile."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import boto3
import psutil
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from tests.support.stack import ACCESS_KEY, REGION, SECRET_KEY, Stack

#: tcpi_state of a connection both ends still hold open (linux/tcp_states.h)
TCP_ESTABLISHED = 1
#: a narrow client's receive buffer and largest segment (bytes)
NARROW_BUFFER = 4096
NARROW_SEGMENT = 536


def connect(stack: Stack, source: str = "127.0.0.1", narrow: bool = False
            ) -> socket.socket:
    """A connection to the stack's API from `source`. `narrow`: a small receive buffer
    and segment size, so that the kernels on either side take little of what this client
    does not read (on loopback they would take megabytes: 64 KiB segments): the rest stays
    in the API's buffers, as it does behind a slow link."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if narrow:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, NARROW_BUFFER)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, NARROW_SEGMENT)
    try:
        sock.bind((source, 0))
    except OSError as exc:  # not Linux: only 127.0.0.1 is on lo
        sock.close()
        pytest.skip(f"cannot bind {source}: {exc}")
    sock.settimeout(10)
    sock.connect(("127.0.0.1", stack.port))
    return sock


def closed_within(sock: socket.socket, seconds: float) -> tuple[float | None, bytes]:
    """(seconds until the server closed `sock`, or None if it did not in `seconds`; what
    it sent before)."""
    t0 = time.monotonic()
    got = b""
    while (left := seconds - (time.monotonic() - t0)) > 0:
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return time.monotonic() - t0, got
        if not data:
            return time.monotonic() - t0, got
        got += data
    return None, got


def is_open(sock: socket.socket) -> bool:
    sock.settimeout(0)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def peer_closed(sock: socket.socket) -> bool:
    """The server closed or reset `sock` (read without reading what it sent: TCP_INFO)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    return bool(struct.unpack("B", info[:1])[0] != TCP_ESTABLISHED)


def signed_request(stack: Stack, body: bytes = b"{}", length: int | None = None,
                   extra: dict[str, str] | None = None) -> bytes:
    """A SigV4-signed ListModels as raw bytes: head (with `extra` unsigned headers, and
    Content-Length `length`, default the body's), then the body."""
    url = f"{stack.url}/"
    req = AWSRequest(method="POST", url=url, data=body, headers={
        "X-Amz-Target": "SageMaker.ListModels", "Content-Type": "application/x-amz-json-1.1"})
    SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "sagemaker", REGION).add_auth(req)
    headers = {k: v for k, v in req.headers.items() if k.lower() not in ("host", "content-length")}
    lines = ["POST / HTTP/1.1", f"Host: 127.0.0.1:{stack.port}",
             f"Content-Length: {len(body) if length is None else length}",
             *(f"{k}: {v}" for k, v in {**headers, **(extra or {})}.items()), "", ""]
    return "\r\n".join(lines).encode() + body


def s3_client(stack: Stack) -> Any:
    return boto3.client("s3", endpoint_url=stack.url, region_name=REGION,
                        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                        config=Config(s3={"addressing_style": "path"}, signature_version="s3v4",
                                      retries={"total_max_attempts": 1}))


def presigned_get(stack: Stack, s3: Any, bucket: str, key: str) -> bytes:
    """A GET of s3://bucket/key as raw bytes (signed in its query: no body, no headers)."""
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key},
                                    ExpiresIn=600)
    path = url.split(f":{stack.port}", 1)[1]
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{stack.port}\r\n\r\n".encode()


def read_reply(sock: socket.socket, timeout: float = 10) -> tuple[int, bytes]:
    """(status, body) of one response (Content-Length framed), or (0, b"") if the server
    closed without one or sent none within `timeout`."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return 0, b""
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    except (ConnectionResetError, TimeoutError):
        return 0, b""
    return int(head.split(b" ", 2)[1]), body


def api_process(stack: Stack) -> psutil.Process:
    assert stack.proc is not None
    for child in psutil.Process(stack.proc.pid).children():
        if "api" in child.cmdline():
            return child
    raise AssertionError("no API process under eaglenest up")


def held_from(api: psutil.Process, source: str) -> int:
    """Connections the API process holds open from client address `source`."""
    return sum(1 for c in api.net_connections(kind="tcp")
               if c.raddr and c.raddr.ip == source and c.status == psutil.CONN_ESTABLISHED)
