"""Connections are bounded before any request is authenticated (foundation/http/connections.py,
issue #35): a half-sent request is closed at the header timeout, headers over the limit get
a 431 before they end (the API's memory stays flat), a body that stops coming gets a 408,
idle sockets past a cap are closed to make room, busy ones past it make a new connection
get a 503, and a signed caller is served meanwhile and afterwards. Issue #51: a reply nobody
reads is a request in flight until the send timeout resets it, holding one block of the
API's memory, and a body trickled under the body timeout is cut by the minimum rate.

Runs against a real `eaglenest up` (API and broker) with small limits, from loopback
addresses of its own (127.0.0.2...: Linux routes all of 127/8 to lo) so that the caps of
one address can be filled without touching the test's boto3 client (127.0.0.1)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.security.raw_http import (
    api_process,
    closed_within,
    connect,
    held_from,
    is_open,
    peer_closed,
    presigned_get,
    read_reply,
    s3_client,
    signed_request,
)
from tests.support.stack import Stack

HEADER_TIMEOUT = 3.0
BODY_TIMEOUT = 3.0
SEND_TIMEOUT = 3.0
PER_ADDRESS = 6
MAX_CONNECTIONS = 16
MAX_HEADER = 16 * 1024  # the default
#: slack on top of a timeout for the server's timer and this test's reads
SLACK = 1.5
MIB = 1024 * 1024
HALF_SENT = b"POST / HTTP/1.1\r\nHost: x\r\n"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("connections"), extra_env={
        "EAGLENEST_WORKER_QUEUES": "",
        "EAGLENEST_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT),
        "EAGLENEST_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
        "EAGLENEST_SEND_TIMEOUT_SECONDS": str(SEND_TIMEOUT),
        "EAGLENEST_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
        "EAGLENEST_MAX_CONNECTIONS_PER_ADDRESS": str(PER_ADDRESS)}).start()
    yield s
    s.stop()


def test_half_sent_request_is_closed_at_the_header_timeout(guarded: Stack) -> None:
    """`POST / HTTP/1.1`, a Host header and nothing more; the same trickled a byte every
    0.2 s (a trickle does not extend the timeout); a connection that sends nothing."""
    silent, trickle, nothing = connect(guarded), connect(guarded), connect(guarded)
    try:
        silent.sendall(HALF_SENT)
        trickle.sendall(HALF_SENT)
        t0 = time.monotonic()
        closed_at = None
        while closed_at is None and time.monotonic() - t0 < HEADER_TIMEOUT + 2 * SLACK:
            with contextlib.suppress(OSError):
                trickle.sendall(b"X")
            after, _ = closed_within(trickle, 0.2)
            closed_at = None if after is None else time.monotonic() - t0
        assert closed_at is not None and closed_at < HEADER_TIMEOUT + SLACK, closed_at
        after, reply = closed_within(silent, SLACK)
        assert after is not None, "the half-sent request is still open"
        assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
        assert json.loads(reply.partition(b"\r\n\r\n")[2])["__type"] == "RequestTimeout"
        after, reply = closed_within(nothing, SLACK)
        assert after is not None and reply == b"", reply[:200]
    finally:
        for sock in (silent, trickle, nothing):
            sock.close()
    assert guarded.client().list_models()["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_headers_over_the_limit_get_431_before_they_end(guarded: Stack) -> None:
    """8 MiB of X-Pad headers, never finished: a 431 comes back while they are still
    being sent, four times, and the API's RSS stays within 50 MB of where it was. A signed
    request with 12 KiB of extra headers is served; with 17 KiB, 431; two of 12 and 10 KiB
    pipelined in one write (22 KiB together) are both served."""
    api = api_process(guarded)
    before = peak = api.memory_info().rss
    pad = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 1000) for i in range(8 * 1024))
    for _ in range(4):
        with connect(guarded) as sock:
            sock.sendall(HALF_SENT)
            with contextlib.suppress(OSError):  # the server may have closed already
                sock.sendall(pad)
            status, body = read_reply(sock)
            assert status == 431, (status, body[:200])
            assert json.loads(body)["__type"] == "RequestHeaderFieldsTooLarge"
            peak = max(peak, api.memory_info().rss)
    assert peak - before < 50 * MIB, (before, peak)
    for extra, want in ((12 * 1024, 200), (17 * 1024, 431)):
        with connect(guarded) as sock:
            sock.sendall(signed_request(guarded, extra={"X-Extra": "e" * extra}))
            status, body = read_reply(sock)
            assert status == want, (extra, status, body[:300])
    with connect(guarded) as sock:  # pipelined in one write: the limit is per request
        sock.sendall(signed_request(guarded, extra={"X-Extra": "e" * 12 * 1024})
                     + signed_request(guarded, extra={"X-Extra": "e" * 10 * 1024}))
        assert read_reply(sock)[0] == 200
        assert read_reply(sock)[0] == 200


def test_idle_connections_past_the_cap_make_room(guarded: Stack) -> None:
    """PER_ADDRESS half-sent requests from 127.0.0.2, then one more: the oldest is closed
    at once (long before the header timeout), the others stay; a signed request from the
    same address is served too, and so is the test's boto3 client."""
    socks = []
    try:
        for _ in range(PER_ADDRESS):
            socks.append(connect(guarded, "127.0.0.2"))
            socks[-1].sendall(HALF_SENT)
            time.sleep(0.05)
        t0 = time.monotonic()
        socks.append(connect(guarded, "127.0.0.2"))
        socks[-1].sendall(HALF_SENT)
        after, _ = closed_within(socks[0], 1.0)
        assert after is not None, "the oldest idle connection is still open"
        assert time.monotonic() - t0 < HEADER_TIMEOUT - 1
        assert all(is_open(s) for s in socks[1:])
        with connect(guarded, "127.0.0.2") as sock:  # makes room the same way
            sock.sendall(signed_request(guarded))
            status, body = read_reply(sock)
            assert status == 200, body[:300]
        assert not is_open(socks[1])
        assert guarded.client().list_models()["ResponseMetadata"]["HTTPStatusCode"] == 200
    finally:
        for sock in socks:
            sock.close()


def test_the_connection_cap_keeps_half_the_open_file_limit() -> None:
    from eaglenest.foundation.http.connection_limits import Limits, OpenConnections

    assert OpenConnections(Limits(max_connections=1024), files=600).capacity == 300
    assert OpenConnections(Limits(max_connections=100, max_per_address=256), files=None).per_address \
        == 100
    assert OpenConnections(Limits(), files=1 << 20).capacity == 1024


def _busy(stack: Stack, source: str, count: int) -> list[socket.socket]:
    """`count` connections from `source` whose signed request waits for its body."""
    socks = []
    for _ in range(count):
        socks.append(connect(stack, source))
        socks[-1].sendall(signed_request(stack, length=2, body=b""))
    time.sleep(0.3)  # their headers are in: each is a request in the application
    return socks


def test_busy_connections_past_the_caps_get_503(guarded: Stack) -> None:
    """PER_ADDRESS requests from 127.0.0.3 waiting for their bodies: one more from there gets
    a 503 while boto3 is served; filling the global cap from 127.0.0.4 and .5 turns away
    every address. At the body timeout each waiting request gets a 408 and is closed, and
    then every address is served again."""
    busy = _busy(guarded, "127.0.0.3", PER_ADDRESS)
    try:
        with connect(guarded, "127.0.0.3") as extra:
            status, body = read_reply(extra)
            assert status == 503, (status, body)
            assert json.loads(body)["__type"] == "ServiceUnavailable"
        assert guarded.client().list_models()["ResponseMetadata"]["HTTPStatusCode"] == 200
        busy += _busy(guarded, "127.0.0.4", PER_ADDRESS)
        busy += _busy(guarded, "127.0.0.5", MAX_CONNECTIONS - 2 * PER_ADDRESS)
        with connect(guarded, "127.0.0.6") as extra:
            assert read_reply(extra)[0] == 503
        t0 = time.monotonic()
        for sock in busy:
            status, body = read_reply(sock, BODY_TIMEOUT + 2 * SLACK)
            assert status == 408, (status, body[:200])
            assert json.loads(body)["__type"] == "RequestTimeout"
        assert time.monotonic() - t0 < BODY_TIMEOUT + SLACK
    finally:
        for sock in busy:
            sock.close()
    for source in ("127.0.0.3", "127.0.0.6"):
        with connect(guarded, source) as sock:
            sock.sendall(signed_request(guarded))
            assert read_reply(sock)[0] == 200
    assert guarded.client().list_models()["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_body_timeout_frees_a_stalled_body(guarded: Stack) -> None:
    """A signed request that sends half its body, then nothing: 408 at the body timeout."""
    with connect(guarded) as sock:
        sock.sendall(signed_request(guarded, body=b"{", length=2))
        t0 = time.monotonic()
        status, body = read_reply(sock, BODY_TIMEOUT + 2 * SLACK)
        assert status == 408, (status, body[:200])
        assert BODY_TIMEOUT - 0.5 < time.monotonic() - t0 < BODY_TIMEOUT + SLACK



# -- the send side, and bodies trickled under the timeout (issue #51) ---------------------
BUCKET = "edge"
BIG = 16 * MIB
TAIL = 900 * 1024  # under the API's read block: the application is done with it at once


@pytest.fixture(scope="module")
def s3(guarded: Stack) -> Any:
    client = s3_client(guarded)
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key="big", Body=b"b" * BIG)
    client.put_object(Bucket=BUCKET, Key="tail", Body=b"t" * TAIL)
    body = client.get_object(Bucket=BUCKET, Key="big")["Body"].read()  # warms the path
    assert len(body) == BIG
    return client


def _unread_gets(stack: Stack, s3: Any, source: str, key: str, count: int,
                 pause: float = 0.0) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        socks.append(connect(stack, source, narrow=True))
        socks[-1].sendall(presigned_get(stack, s3, BUCKET, key))
        time.sleep(pause)
    return socks


def _all_closed(socks: list[socket.socket], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not all(peer_closed(s) for s in socks):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _read_with_a_pause(sock: socket.socket, first: int, pause: float) -> tuple[int, int]:
    """(status, body length) of a reply read `first` bytes in, then after `pause` s."""
    sock.settimeout(10)
    data = b""
    while len(data) < first and (chunk := sock.recv(65536)):
        data += chunk
    time.sleep(pause)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    received = len(body)
    while received < length and (chunk := sock.recv(1 << 20)):
        received += len(chunk)
    return int(head.split(b" ", 2)[1]), received


def test_unread_downloads_are_reset_at_the_send_timeout(guarded: Stack, s3: Any) -> None:
    """PER_ADDRESS GETs of a 16 MiB object from each of 127.0.0.7 and .8, never read. They
    are requests in flight: one more from .7 gets a 503 while boto3 is served. The API
    keeps less than 512 KiB of each (one block read from disk at a time, the next only once
    the last is sent), resets each at the send timeout, and reads no more of the object
    for it; then a reader from .7 that pauses for less than the timeout halfway gets the
    whole object."""
    api = api_process(guarded)
    before, read_before = api.memory_info().rss, api.io_counters().read_chars
    socks = _unread_gets(guarded, s3, "127.0.0.7", "big", PER_ADDRESS)
    socks += _unread_gets(guarded, s3, "127.0.0.8", "big", PER_ADDRESS)
    t0 = time.monotonic()
    try:
        time.sleep(1.0)
        grown = api.memory_info().rss - before
        with connect(guarded, "127.0.0.7") as extra:
            assert read_reply(extra)[0] == 503
        assert guarded.client().list_models()["ResponseMetadata"]["HTTPStatusCode"] == 200
        assert _all_closed(socks, SEND_TIMEOUT + 2 * SLACK), \
            f"{sum(not peer_closed(s) for s in socks)} unread replies still open"
        assert time.monotonic() - t0 < SEND_TIMEOUT + 2 * SLACK
        assert grown < len(socks) * MIB // 2, grown / MIB
        time.sleep(0.5)
        read = api.io_counters().read_chars - read_before
        assert read < len(socks) * 2 * MIB, read / MIB  # not the 16 MiB of each
    finally:
        for sock in socks:
            sock.close()
    with connect(guarded, "127.0.0.7") as sock:
        sock.sendall(presigned_get(guarded, s3, BUCKET, "big"))
        assert _read_with_a_pause(sock, MIB, SEND_TIMEOUT * 0.6) == (200, BIG)


def test_finished_replies_nobody_reads_still_count(guarded: Stack, s3: Any) -> None:
    """3 x PER_ADDRESS GETs of a 900 KiB object from 127.0.0.9, never read: the application
    is done with each at once, but the reply waits in the API's buffers, so the connection
    is still in flight. The API holds at most PER_ADDRESS of them (the others get a 503:
    none is closed to make room, and none left open uncounted), none after the send
    timeout."""
    api = api_process(guarded)
    socks = _unread_gets(guarded, s3, "127.0.0.9", "tail", 3 * PER_ADDRESS, pause=0.1)
    try:
        time.sleep(0.5)
        held = held_from(api, "127.0.0.9")
        assert held <= PER_ADDRESS, held
        assert _all_closed(socks, SEND_TIMEOUT + 2 * SLACK)
        assert held_from(api, "127.0.0.9") == 0
    finally:
        for sock in socks:
            sock.close()
    assert len(s3.get_object(Bucket=BUCKET, Key="tail")["Body"].read()) == TAIL


def test_a_trickled_body_is_cut_by_the_minimum_rate(guarded: Stack) -> None:
    """A signed request's 64-byte body sent a byte a second, every gap under the body
    timeout: 1 byte/s is under EAGLENEST_MIN_TRANSFER_RATE, so once the body timeout has
    passed the request gets a 408 (it used to hold its connection for 64 s)."""
    with connect(guarded) as sock:
        sock.sendall(signed_request(guarded, body=b"", length=64))
        t0 = time.monotonic()
        got, after = b"", None
        while after is None and time.monotonic() - t0 < BODY_TIMEOUT + 2 * SLACK:
            with contextlib.suppress(OSError):
                sock.sendall(b" ")
            after, data = closed_within(sock, 1.0)
            got += data
        elapsed = time.monotonic() - t0
    assert got.startswith(b"HTTP/1.1 408 "), got[:200]
    assert json.loads(got.partition(b"\r\n\r\n")[2])["__type"] == "RequestTimeout"
    assert BODY_TIMEOUT - 0.5 < elapsed < BODY_TIMEOUT + SLACK, elapsed


def test_limits_are_documented() -> None:
    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "configuration.md").read_text()
    for name in ("EAGLENEST_MAX_HEADER_BYTES", "EAGLENEST_HEADER_TIMEOUT_SECONDS",
                 "EAGLENEST_BODY_TIMEOUT_SECONDS", "EAGLENEST_SEND_TIMEOUT_SECONDS",
                 "EAGLENEST_MIN_TRANSFER_RATE", "EAGLENEST_MAX_CONNECTIONS",
                 "EAGLENEST_MAX_CONNECTIONS_PER_ADDRESS"):
        assert f"`{name}`" in text, name
