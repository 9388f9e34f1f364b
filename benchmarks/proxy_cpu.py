"""The runtime proxy's own cost, measured without a model: CPU per request and per frame.

    python -m benchmarks.proxy_cpu [--requests 200] [--frames 1,16,64] [--gap-ms 1]
                                   [--concurrency 1,8] [--repeats 3] [--compare-with DIR]

`benchmarks.endpoint` measures the proxy beside a real model server, which on a small
machine takes the cores the proxy needs, so its figures mix the proxy's work with waiting
for a core. Here the model server is a stand-in (`FakeModelServer`: an OpenAI-style
`/v1/completions` SSE stream of N events, each its own write, `--gap-ms` apart, as a model
emits tokens) and the API process (`create_app` under uvicorn, as `eaglenest api` runs it)
is pinned to core 0 while the stand-in and this client share core 1. The API's routes are
pinned to the stand-in (`Routes.resolve` is replaced in that process only: no database or
endpoint manager is involved); everything else on the path is the product's code: SigV4
verification, body translation, the backend client, event-stream framing, uvicorn.

Per (frames, concurrency): the API process's CPU time per request (psutil, over all
requests), its own `/metrics` proxy seconds per request (request in -> out to the model
server, plus chunk in -> frame out), from the 1-frame and N-frame rows the cost of one
more frame (the slope), and what the proxy adds to a caller's TTFT and end-to-end time:
the median through sagemaker-runtime minus the median of the same requests sent straight to
the stand-in (which answers on a fixed clock, so the difference is the proxy's, not a
model's noise). Relate the added TTFT to a real model's TTFT for the percentage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
ACCESS_KEY, SECRET_KEY, REGION = "AKIDPROXYBENCH", "proxy-bench-secret", "us-east-1"
EVENT = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "ep",
         "choices": [{"index": 0, "text": " token", "logprobs": None, "finish_reason": None}]}


class FakeModelServer(asyncio.Protocol):
    """POST -> 200 chunked text/event-stream of `frames` events, `gap` seconds apart."""

    frames, gap = 16, 0.001

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        head, sep, rest = self.buf.partition(b"\r\n\r\n")
        if not sep:
            return
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        if len(rest) < length:
            return
        self.buf = rest[length:]
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
        asyncio.get_running_loop().call_later(self.gap, self._emit, 0)

    def _chunk(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _emit(self, i: int) -> None:
        if i < self.frames:
            self._chunk(b"data: " + json.dumps(EVENT).encode() + b"\n\n")
            asyncio.get_running_loop().call_later(self.gap, self._emit, i + 1)
        else:
            self._chunk(b"data: [DONE]\n\n")
            if not self.transport.is_closing():
                self.transport.write(b"0\r\n\r\n")


def serve_fake(port: int, frames: int, gap: float) -> None:
    import uvloop

    FakeModelServer.frames, FakeModelServer.gap = frames, gap

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(
            FakeModelServer, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(main())


def serve_api(port: int, backend_port: int, data_dir: Path) -> None:
    import uvicorn

    import eaglenest.api.runtime.routes as routes
    from eaglenest.api.app import create_app
    from eaglenest.foundation.settings import Settings

    async def resolve(self: object, name: str, target_variant: str | None,
                      fresh: bool = False, *, account_id: str | None = None) -> routes.Route:
        return routes.Route("AllTraffic", [f"http://127.0.0.1:{backend_port}"], name, None,
                            "InService", cached=True)

    routes.Routes.resolve = resolve  # type: ignore[method-assign]
    settings = Settings(data_dir=data_dir, access_key_id=ACCESS_KEY,
                        secret_access_key=SECRET_KEY, region=REGION)
    # the broker is never used on this path (it would only ask for an instance's recovery)
    app = create_app(settings, "redis://127.0.0.1:9/0")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                log_config=None)


Timed = tuple[int, float, float]  # (events, TTFT s, e2e s)


def _signed_call(http: httpx.Client, base: str) -> Timed:
    """Through sagemaker-runtime: signed as boto3 signs (not timed), event-stream parsed."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    from botocore.eventstream import EventStreamBuffer

    url = f"{base}/endpoints/ep/invocations-response-stream"
    body = json.dumps({"prompt": "hi", "max_tokens": 16})
    req = AWSRequest("POST", url, data=body, headers={"Content-Type": "application/json"})
    SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "sagemaker", REGION).add_auth(req)
    events, first, start = 0, 0.0, time.perf_counter()
    with http.stream("POST", url, content=body, headers=dict(req.headers), timeout=60) as r:
        if r.status_code != 200:
            raise RuntimeError(f"proxy answered {r.status_code}: {r.read()[:300]!r}")
        buf = EventStreamBuffer()
        for chunk in r.iter_bytes():
            buf.add_data(chunk)
            events += sum(1 for _ in buf)
            first = first or time.perf_counter()
    end = time.perf_counter()
    return events, first - start, end - start


def _direct_call(http: httpx.Client, url: str) -> Timed:
    """Straight to the stand-in model server, SSE lines parsed."""
    body = {"model": "ep", "prompt": "hi", "max_tokens": 16, "stream": True}
    events, first, start = 0, 0.0, time.perf_counter()
    with http.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                events += 1
                first = first or time.perf_counter()
    end = time.perf_counter()
    return events, first - start, end - start


#: the proxy's /metrics counters: `own` (request in -> request handed to the model server,
#: and chunk in -> frame out; waiting on the model server excluded), `forward` (the first
#: part alone) and `frames`
RUNTIME_COUNTERS = {"eaglenest_runtime_proxy_seconds_total": "own",
                    "eaglenest_runtime_forward_seconds_total": "forward",
                    "eaglenest_runtime_frames_total": "frames"}


def runtime_counters(base: str) -> dict[str, float]:
    """The API's own counters of the proxy's time (`RUNTIME_COUNTERS`), read from /metrics."""
    got = {}
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        key, _, value = line.partition(" ")
        if key in RUNTIME_COUNTERS:
            got[RUNTIME_COUNTERS[key]] = float(value)
    if len(got) != len(RUNTIME_COUNTERS):
        raise RuntimeError(f"the API's /metrics lacks some of {sorted(RUNTIME_COUNTERS)}")
    return got


def _wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in 60 s")


def measure(frames: int, conc: int, requests: int, gap_ms: float,
            api_root: Path = ROOT) -> dict[str, float]:
    """One run; the API process imports the product's code from `api_root` (another
    checkout, for a before/after in one run)."""
    import psutil

    from eaglenest.foundation.host.processes import free_port

    api_port, fake_port = free_port(), free_port()
    data_dir = Path(tempfile.mkdtemp(prefix="eaglenest-proxy-"))
    me = [sys.executable, str(Path(__file__).resolve())]
    fake = subprocess.Popen([*me, "--fake", str(fake_port), str(frames), str(gap_ms / 1000)],
                            cwd=ROOT)
    api = subprocess.Popen([*me, "--api", str(api_port), str(fake_port), str(data_dir)],
                           cwd=api_root, env={**os.environ, "PYTHONPATH": str(api_root)})
    try:
        base = f"http://127.0.0.1:{api_port}"
        _wait_up(f"{base}/ping", api)
        if (os.cpu_count() or 1) >= 2:
            for tid in os.listdir(f"/proc/{api.pid}/task"):
                os.sched_setaffinity(int(tid), {0})
            os.sched_setaffinity(fake.pid, {1})
            os.sched_setaffinity(0, {1})
        http = httpx.Client(limits=httpx.Limits(max_keepalive_connections=16))
        fake_url = f"http://127.0.0.1:{fake_port}"
        with ThreadPoolExecutor(conc) as pool:
            list(pool.map(lambda _: _signed_call(http, base), range(4 * conc)))  # warm-up
            list(pool.map(lambda _: _direct_call(http, fake_url), range(4 * conc)))
            proc = psutil.Process(api.pid)
            cpu0, own0 = sum(proc.cpu_times()[:2]), runtime_counters(base)["own"]
            t0 = time.perf_counter()
            got = list(pool.map(lambda _: _signed_call(http, base), range(requests)))
            wall = time.perf_counter() - t0
            cpu1, own1 = sum(proc.cpu_times()[:2]), runtime_counters(base)["own"]
            direct = list(pool.map(lambda _: _direct_call(http, fake_url), range(requests)))
        http.close()
        if any(g[0] != frames for g in got + direct):
            raise RuntimeError(f"expected {frames} events per request, got "
                               f"{ {g[0] for g in got + direct} }")
        p50 = {k: 1000 * (statistics.median(g[i] for g in got)
                          - statistics.median(g[i] for g in direct))
               for i, k in ((1, "ttft_added_ms"), (2, "e2e_added_ms"))}
        return {"cpu_ms": 1000 * (cpu1 - cpu0) / requests,
                "own_ms": 1000 * (own1 - own0) / requests, "req_s": requests / wall, **p50}
    finally:
        for p in (api, fake):
            p.terminate()
            p.wait(timeout=30)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--fake":
        serve_fake(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--api":
        serve_api(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--frames", default="1,16,64")
    p.add_argument("--gap-ms", type=float, default=1.0,
                   help="time between the stand-in model server's events")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--repeats", type=int, default=3, help="runs per row (median reported)")
    p.add_argument("--compare-with", type=Path, default=None, metavar="CHECKOUT",
                   help="also run the API from this checkout (e.g. a git worktree of an "
                        "earlier commit), alternating with this one run by run")
    args = p.parse_args()
    frames = [int(f) for f in args.frames.split(",")]
    trees = {"this": ROOT, **({"other": args.compare_with} if args.compare_with else {})}
    print(f"API on core 0; stand-in model server and client on core 1; {args.requests} "
          f"signed streaming requests per run, events {args.gap_ms:g} ms apart, median of "
          f"{args.repeats} runs" + (f"; other = {args.compare_with}" if args.compare_with else ""))
    print("conc  frames  tree   API CPU ms/req  proxy own ms/req  req/s  "
          "TTFT added p50 ms  e2e added p50 ms")
    for conc in (int(c) for c in args.concurrency.split(",")):
        rows: dict[tuple[str, int], dict[str, float]] = {}
        for n in frames:
            runs: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
            for _ in range(args.repeats):
                for tree, root in trees.items():
                    runs[tree].append(measure(n, conc, args.requests, args.gap_ms, root))
            for tree in trees:
                m = rows[tree, n] = {k: statistics.median(r[k] for r in runs[tree])
                                     for k in runs[tree][0]}
                print(f"{conc:>4}  {n:>6}  {tree:<5}  {m['cpu_ms']:>14.3f}  "
                      f"{m['own_ms']:>16.3f}  {m['req_s']:>5.1f}  "
                      f"{m['ttft_added_ms']:>17.3f}  {m['e2e_added_ms']:>16.3f}")
        lo, hi = min(frames), max(frames)
        for tree in trees if hi > lo else ():
            per = {k: 1000 * (rows[tree, hi][k] - rows[tree, lo][k]) / (hi - lo)
                   for k in ("cpu_ms", "own_ms")}
            print(f"      {tree}: one more frame {per['cpu_ms']:.1f} us CPU, "
                  f"{per['own_ms']:.1f} us own time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
