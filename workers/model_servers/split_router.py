"""Split serving: a speculating server and a plain one behind one port, chosen by load.

Why: vLLM's speculative path costs throughput even where its dynamic speculation drafts no
tokens (K = 0 still runs the drafter and the speculative bookkeeping: 6-9% below the target
alone at 4-16 running requests, docs/speculation-schedule.md). Where an endpoint's schedule
turns speculation off above some load, the instance runs two model servers, the target with
the head and the target alone, and this router sends each new request to one of them.

Policy (`SplitPolicy`): a request goes to the speculating server while fewer than
``speculate_upto`` requests are in flight (this one not counted) and the plain server has
none; otherwise to the plain server. Once the plain server serves, new requests follow it
until it drains, so under steady load above the threshold every request ends up on the
plain server and the speculating one idles (an idle vLLM process takes no CPU). A request
stays on the server it started on. Example, ``speculate_upto`` = 2: requests 1 and 2 go to
the speculating server; the 3rd (2 in flight) to the plain one; while that one runs, the
next requests go there too; once the load is back to 2 or fewer and the plain server has
drained, new requests speculate again.

Bursts: while both servers compute, each runs its OpenMP threads on the same cores and
both slow down far more than twofold, so the requests of a burst should not be split
between them. A request that finds the router idle opens a window of ``burst_s``; every
request arriving within it waits for its end and then they are routed together: all to
the plain server when there are more than ``speculate_upto`` of them, else all to the
speculating one. (Four clients starting at once thus all reach the plain server, where
without the window two would speculate beside two plain ones.) The window is the price of
an arrival at an idle router: ``burst_s`` more time to first token.

Process contract: the router is the instance's one recorded child (foundation/host/children.py);
it starts both servers as its own children in its process group (they die with it, and the
owner's SIGTERM/SIGKILL of the group reaches them), on ports it picks on 127.0.0.1. If
either server exits the router stops the other and exits 1, so the instance's health check
fails and the endpoint's recovery restarts it. Once both answer /health, each in turn serves
a warm-up burst (a vLLM server's first requests at a batch size pay one-time costs; the
plain server may otherwise meet its first requests only under high load). `/health`
answers 200 (with the instance's proof, foundation/http/instance_auth.py) once both are warm and
answer theirs; `/metrics` is the speculating
server's page (its spec-decode counters are the ones that measure speculation) followed by
the router's counters (`eaglenest:split_requests_total{server=...}`, and of those the ones
routed as part of a burst, `eaglenest:split_burst_requests_total`) and the requests in
flight on each server (`eaglenest:split_running`).
Every other request is relayed as it is, streamed bodies chunk by chunk, through the runtime
proxy's HTTP/1.1 client (foundation/http/backend_client.py): each server proves it holds the
instance's secret before a request reaches it, and the request carries that secret (both
servers check it themselves) in place of the caller's, which the router has checked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Receive, Send

from eaglenest.foundation.host.forking import die_with_parent
from eaglenest.foundation.host.loops import Loop
from eaglenest.foundation.host.processes import free_port
from eaglenest.foundation.http import instance_auth
from eaglenest.foundation.http.asgi import read_body, reply
from eaglenest.foundation.http.backend_client import BackendClient, BackendError

log = logging.getLogger("eaglenest.split")
SPEC, PLAIN = "speculative", "plain"
WARM_UP_BATCH = 4
#: silence on a reply after which the router gives up on it (a long non-streamed reply
#: on a loaded CPU host can take minutes; the API's own timeouts sit in front)
READ_TIMEOUT_S = 3600.0
_HOP = {b"host", b"content-length", b"transfer-encoding", b"connection", b"keep-alive"}


@dataclass
class _Window:
    end: float  # monotonic time it closes
    count: int = 0  # requests that arrived within it
    choice: str | None = None  # where they all go, decided by the first to wake


@dataclass
class SplitPolicy:
    """Requests in flight per server and the choice for the next one (module docstring)."""

    speculate_upto: int
    burst_s: float = 0.0
    spec: int = 0
    plain: int = 0
    _window: _Window | None = None  # the latest burst window
    #: requests routed to each server, and those routed at the close of a burst window
    routed: dict[str, int] = field(default_factory=lambda: {SPEC: 0, PLAIN: 0})
    bursts: dict[str, int] = field(default_factory=lambda: {SPEC: 0, PLAIN: 0})

    def choose(self) -> str:
        if self.plain == 0 and self.spec < self.speculate_upto:
            return self._take(SPEC)
        return self._take(PLAIN)

    async def admit(self) -> str:
        """`choose`, after the burst window this request falls in (if any) has closed."""
        now = time.monotonic()
        window = self._window
        if window is None or now >= window.end:
            if self.burst_s <= 0 or self.spec or self.plain:
                return self.choose()
            window = self._window = _Window(now + self.burst_s)
        window.count += 1
        await asyncio.sleep(window.end - now)
        if window.choice is None:
            fits = self.plain == 0 and self.spec + window.count <= self.speculate_upto
            window.choice = SPEC if fits else PLAIN
        self.bursts[window.choice] += 1
        return self._take(window.choice)

    def _take(self, server: str) -> str:
        self.routed[server] += 1
        if server == SPEC:
            self.spec += 1
        else:
            self.plain += 1
        return server

    def done(self, server: str) -> None:
        if server == SPEC:
            self.spec -= 1
        else:
            self.plain -= 1

    def metrics(self) -> bytes:
        """Prometheus lines of the router's own counters."""
        lines = ["# TYPE eaglenest:split_requests_total counter"]
        lines += [f'eaglenest:split_requests_total{{server="{k}"}} {v}'
                  for k, v in self.routed.items()]
        lines.append("# TYPE eaglenest:split_running gauge")
        lines += [f'eaglenest:split_running{{server="{SPEC}"}} {self.spec}',
                  f'eaglenest:split_running{{server="{PLAIN}"}} {self.plain}']
        lines.append("# TYPE eaglenest:split_burst_requests_total counter")
        lines += [f'eaglenest:split_burst_requests_total{{server="{k}"}} {v}'
                  for k, v in self.bursts.items()]
        return ("\n".join(lines) + "\n").encode()


def parse_routed(page: str) -> dict[str, int]:
    """Server -> requests routed to it, from a split instance's /metrics page."""
    out = {}
    for line in page.splitlines():
        if line.startswith('eaglenest:split_requests_total{server="'):
            server = line.split('"', 2)[1]
            out[server] = int(float(line.rsplit(" ", 1)[1]))
    return out


def with_port(argv: list[str], port: int) -> list[str]:
    """`argv` with the value after its ``--port`` replaced (appended when it has none)."""
    out = list(argv)
    if "--port" in out:
        out[out.index("--port") + 1] = str(port)
    else:
        out += ["--port", str(port)]
    return out


class Backends:
    """The two model servers: started in this process group, watched, stopped together."""

    def __init__(self, commands: dict[str, list[str]]) -> None:
        self.urls: dict[str, str] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        me = os.getpid()
        for name, argv in commands.items():
            port = free_port()
            self.urls[name] = f"http://127.0.0.1:{port}"
            self.procs[name] = subprocess.Popen(  # same process group: the owner's killpg
                with_port(argv, port), preexec_fn=lambda: die_with_parent(me))

    def exited(self) -> str | None:
        """The name of a server that has exited, if any."""
        return next((n for n, p in self.procs.items() if p.poll() is not None), None)

    def stop(self, timeout: float = 20) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class SplitApp:
    """The router's ASGI app (wrapped in InstanceGuard by `main`)."""

    def __init__(self, backends: Backends, policy: SplitPolicy, secret: str | None,
                 served_name: str = "", max_model_len: int = 2048) -> None:
        self.backends, self.policy, self.secret = backends, policy, secret
        self.served_name, self.max_model_len = served_name, max_model_len
        # each server proves it holds the instance's secret before a request reaches it
        self.client = BackendClient(connect_timeout=10, read_timeout=READ_TIMEOUT_S)
        self.warm = False
        self._warming: asyncio.Task[None] | None = None

    async def _warm_up(self) -> None:
        """Until both answer /health, then each server in turn serves `WARM_UP_BATCH`
        requests at once (long prompts, a few tokens): batch shapes and KV-cache pages it
        would otherwise first meet under load."""
        while not await self.healthy():
            await asyncio.sleep(0.5)
        repeats = max(1, min(48, (self.max_model_len - 16) // 5))  # ~4 tokens each
        body = {"model": self.served_name, "prompt": "Hello, world. " * repeats,
                "max_tokens": 8, "temperature": 0}
        for name, url in self.backends.urls.items():
            replies = await asyncio.gather(*(
                self._fetch("POST", f"{url}/v1/completions", body)
                for _ in range(WARM_UP_BATCH)), return_exceptions=True)
            for r in replies:  # the server is healthy: it serves anyway
                if isinstance(r, BaseException) or r[0] != 200:
                    log.warning("warm-up of the %s server: %s", name,
                                r if isinstance(r, BaseException) else r[1][:200])
                    break
        self.warm = True

    async def _fetch(self, method: str, url: str, body: Any = None) -> tuple[int, bytes]:
        """(status, whole body) of one request of the router's own (JSON `body` if any)."""
        raw = b"" if body is None else json.dumps(body).encode()
        headers = [("Content-Type", "application/json")] if raw else []
        reply = await self.client.request(method, url, raw, headers, self.secret)
        try:
            return reply.status_code, await reply.aread()
        finally:
            reply.close()

    async def healthy(self) -> bool:
        return all(await asyncio.gather(*(
            asyncio.to_thread(instance_auth.probe, url, self.secret, 2)
            for url in self.backends.urls.values())))

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            self._warming = asyncio.ensure_future(self._warm_up())
            await _lifespan(receive, send, self.client.aclose)
            return
        path = scope["path"]
        if path == "/health":
            ok = self.warm and await self.healthy()
            await reply(send, 200 if ok else 503, b"" if ok else b"model servers starting")
            return
        if path == "/metrics":
            await self._metrics(scope, send)
            return
        routed = scope["method"] == "POST"  # generation; GETs (/v1/models) ask the first
        server = await self.policy.admit() if routed else SPEC
        try:
            await self._relay(scope, receive, send, self.backends.urls[server])
        finally:
            if routed:
                self.policy.done(server)

    async def _metrics(self, scope: dict[str, Any], send: Send) -> None:
        try:
            status, page = await self._fetch("GET", f"{self.backends.urls[SPEC]}/metrics")
        except BackendError as exc:
            await reply(send, 502, f"model server unreachable: {exc}".encode())
            return
        body = page if status != 200 else page.rstrip(b"\n") + b"\n" + self.policy.metrics()
        await reply(send, status, body)

    async def _relay(self, scope: dict[str, Any], receive: Receive, send: Send,
                     base: str) -> None:
        """The request as it came (the caller's Authorization replaced by the instance's
        secret, which the router has already checked: `main`'s InstanceGuard), the reply
        streamed back chunk by chunk. A caller who goes away closes the connection to the
        model server, which then stops generating."""
        body = await read_body(receive)
        drop = _HOP | {b"authorization"} if self.secret else _HOP
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
                   if k.lower() not in drop]
        query = scope.get("query_string", b"").decode("latin-1")
        path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        url = base + path + (f"?{query}" if query else "")
        try:
            upstream = await self.client.request(scope["method"], url, body, headers,
                                                 self.secret)
        except BackendError as exc:
            await reply(send, 502, f"model server unreachable: {exc}".encode())
            return
        try:
            await send({"type": "http.response.start", "status": upstream.status_code,
                        "headers": [(k.encode("latin-1"), v.encode("latin-1"))
                                    for k, v in upstream.headers.items()
                                    if k.encode("latin-1") not in _HOP]})
            async for chunk in upstream.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except BackendError as exc:  # after the head: the caller sees a cut reply
            log.warning("relay from %s ended early: %s", base, exc)
        finally:
            upstream.close()


async def _lifespan(receive: Receive, send: Send, close: Callable[[], Awaitable[None]]
                    ) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await close()
            await send({"type": "lifespan.shutdown.complete"})
            return


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eaglenest.workers.model_servers.split_router")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--speculate-upto", type=int, required=True,
                   help="requests in flight up to which a new one may speculate")
    p.add_argument("--burst-ms", type=float, default=10.0,
                   help="arrivals at an idle router within this window are routed together")
    p.add_argument("--speculative-command", required=True, help="JSON argv of the server "
                   "with the head (its --port is replaced)")
    p.add_argument("--plain-command", required=True, help="JSON argv of the target alone")
    return p


def _watch(backends: Backends, web: Any) -> Loop:
    """Stop serving when either model server exits (its instance is then restarted). Checks
    every 0.5 s until the server stops, whatever a check raises (foundation/host/loops.py)."""
    done = threading.Event()

    def check() -> None:
        gone = None if web.should_exit else backends.exited()
        if gone is not None:
            log.error("the %s model server exited with %s: stopping", gone,
                      backends.procs[gone].returncode)
            web.exit_code = 1
            web.should_exit = True
        if web.should_exit:
            done.set()

    return Loop("watch", check, 0.5, stop=done, first=True, max_backoff=0.5, logger=log)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from eaglenest.foundation.http.connection_limits import MODEL_SERVER_LIMITS
    from eaglenest.foundation.http.connections import uvicorn_options

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = build_parser().parse_args(argv)
    if args.speculate_upto < 1:
        raise SystemExit("--speculate-upto must be at least 1")
    commands = {SPEC: json.loads(args.speculative_command), PLAIN: json.loads(args.plain_command)}
    backends = Backends(commands)
    secret = os.environ.get(instance_auth.SECRET_ENV) or None
    argv = commands[SPEC]
    name = argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else ""
    max_len = int(argv[argv.index("--max-model-len") + 1]) if "--max-model-len" in argv else 2048
    app = SplitApp(backends, SplitPolicy(args.speculate_upto, args.burst_ms / 1000), secret,
                   name, max_len)
    # connections are bounded before the instance secret is checked (foundation/http/connections.py)
    config = uvicorn.Config(instance_auth.InstanceGuard(app), host=args.host, port=args.port,
                            log_level="warning", access_log=False,
                            **uvicorn_options(MODEL_SERVER_LIMITS))
    web = uvicorn.Server(config)
    web.exit_code = 0  # type: ignore[attr-defined]
    signal.signal(signal.SIGTERM, lambda *_: setattr(web, "should_exit", True))
    _watch(backends, web).start()
    try:
        web.run()
    finally:
        backends.stop()
    return 1 if getattr(web, "exit_code", 0) or not web.started else 0


if __name__ == "__main__":
    sys.exit(main())
