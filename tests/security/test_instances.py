"""Serving processes only the proxy can reach: they listen on 127.0.0.1, refuse requests
without their instance secret, and a process that takes a dead instance's port is never
trusted: it gets no prompt, its answers never reach a caller, the health check fails it
and the worker replaces the instance."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import httpx
import psutil
import pytest
from botocore.exceptions import ClientError

from tests.security.conftest import error_of, instances
from tests.support.stack import Stack


def invoke(stack: Stack, name: str, text: str) -> dict:
    rt = stack.client("sagemaker-runtime")
    r = rt.invoke_endpoint(EndpointName=name, ContentType="application/json", Body=json.dumps(
        {"inputs": text, "parameters": {"max_new_tokens": 4, "temperature": 0}}))
    return json.loads(r["Body"].read())


def test_instance_listens_on_loopback_and_wants_its_secret(secure: Stack, served: str) -> None:
    (inst,) = instances(secure, served)
    assert urlparse(inst["url"]).hostname == "127.0.0.1"
    listening = [c.laddr for c in psutil.Process(inst["pid"]).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening)
    body = {"model": served, "prompt": "hello", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer guess"}):
        r = httpx.post(f"{inst['url']}/v1/completions", json=body, headers=headers, timeout=10)
        assert r.status_code == 401 and r.json()["type"] == "Unauthorized"
        assert httpx.get(f"{inst['url']}/health", headers=headers, timeout=10).status_code == 401
    ok = httpx.post(f"{inst['url']}/v1/completions", json=body, timeout=60,
                    headers={"Authorization": f"Bearer {inst['secret']}"})
    assert ok.status_code == 200
    assert invoke(secure, served, "hello")["generated_text"] is not None


class StandIn(BaseHTTPRequestHandler):
    """Answers everything with 200 and a completion, and records what it was sent."""

    seen: list[tuple[str, str, bytes]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        StandIn.seen.append((self.command, self.path, self.rfile.read(length)))
        body = json.dumps({"choices": [{"text": "from the stand-in"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def test_a_process_on_a_reused_port_is_never_trusted(secure: Stack, served: str) -> None:
    (inst,) = instances(secure, served)
    port = urlparse(inst["url"]).port
    assert port is not None
    os.kill(inst["pid"], signal.SIGKILL)
    ThreadingHTTPServer.allow_reuse_address = True
    deadline = time.monotonic() + 10
    while True:
        try:
            server = ThreadingHTTPServer(("127.0.0.1", port), StandIn)
            break
        except OSError:
            if time.monotonic() > deadline:
                pytest.skip(f"port {port} was not freed in time")
            time.sleep(0.1)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ClientError) as exc:
            invoke(secure, served, "my secret prompt")
        code, message = error_of(exc)
        assert code == "ModelError"
        assert "is not the instance EagleNest started" in message
        assert not [s for s in StandIn.seen if s[0] == "POST"]  # no prompt reached it
        assert all(path == "/health" for _, path, _ in StandIn.seen)
        # the worker's health check fails the stand-in and replaces the instance
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            now = instances(secure, served)
            if now and now[0]["url"] != inst["url"] and \
                    secure.client().describe_endpoint(EndpointName=served)[
                        "EndpointStatus"] == "InService":
                break
            time.sleep(1)
        else:
            raise AssertionError(f"the instance was not replaced: {instances(secure, served)}")
        assert "from the stand-in" not in json.dumps(invoke(secure, served, "again"))
        assert not [s for s in StandIn.seen if s[0] == "POST"]
    finally:
        server.shutdown()
        server.server_close()
