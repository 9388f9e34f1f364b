"""Proxy overhead: sagemaker-runtime (boto3, SigV4, event-stream) vs the model server's own
OpenAI API, same endpoint, same prompts, concurrency 1 and 8, side by side in one run.

Three paths: `direct` (httpx to the model server), `signed` (the same httpx client to
sagemaker-runtime's URL with SigV4 headers from botocore's signer: the proxy's own cost,
with the client held equal) and `boto3` (invoke_endpoint_with_response_stream: adds
boto3's request building and event-stream parsing on the client). The API process's CPU
time per request is printed for each path too (load-independent, unlike latency).

    python -m benchmarks.endpoint [--target DIR] [--backend embedded|vllm] [--requests 40]
                                  [--max-tokens 16] [--rounds 3] [--env KEY=VALUE ...]
                                  [--whole] [--pin-server CPUS] [--concurrency 1,8]
                                  [--nice-server N]

`--whole` adds non-streamed requests (`direct-whole`: the model server's /v1/completions;
`invoke-whole`: InvokeEndpoint, signed as above): the proxy's cost per request without a
frame per token.

Without --target a tiny random Llama is built (eaglenest.models.tiny): its forward is cheap,
so the proxy's own cost is as visible as it can be. Both paths are warmed up first (8
requests each), keep their connections open between requests (one httpx.Client, one boto3
client, as a real caller would), and are measured in interleaved rounds (direct, runtime,
runtime, direct, ...) so that drift in machine load hits both alike; each figure is the
median over the rounds. Prints requests/s, TTFT p50, ITL p50 and e2e p50 for both paths and
the proxy's added TTFT and e2e (ms per request and %).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.eventstream import EventStreamBuffer

from benchmarks.proxy_cpu import runtime_counters
from benchmarks.user_stack import UserStack

ROOT = Path(__file__).resolve().parents[1]

PROMPTS = ["Natalia sold 48 clips", "def add(a, b):", "The quick brown fox", "import os"]


def _direct(http: httpx.Client, url: str, prompt: str,
            max_tokens: int) -> tuple[float, list[float], float]:
    start = time.perf_counter()
    marks: list[float] = []
    body = {"model": "ep", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    with http.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0].get("text"):
                marks.append(time.perf_counter())
    return _timings(start, marks)


def _proxied(rt: object, prompt: str, max_tokens: int) -> tuple[float, list[float], float]:
    start = time.perf_counter()
    marks: list[float] = []
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    resp = rt.invoke_endpoint_with_response_stream(  # type: ignore[attr-defined]
        EndpointName="ep", ContentType="application/json", Body=body)
    for event in resp["Body"]:
        for line in event["PayloadPart"]["Bytes"].decode().splitlines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0].get("text"):
                marks.append(time.perf_counter())
    return _timings(start, marks)


def _signed_headers(stack: UserStack, url: str, body: str) -> dict[str, str]:
    req = AWSRequest("POST", url, data=body, headers={"Content-Type": "application/json"})
    SigV4Auth(stack.credentials(), "sagemaker", stack.settings.region).add_auth(req)
    return dict(req.headers)


def _direct_whole(http: httpx.Client, url: str, prompt: str,
                  max_tokens: int) -> tuple[float, list[float], float]:
    """One non-streamed completion straight from the model server."""
    body = {"model": "ep", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    start = time.perf_counter()
    r = http.post(f"{url}/v1/completions", json=body, timeout=120)
    r.raise_for_status()
    return _timings(start, [])


def _invoke_whole(http: httpx.Client, stack: UserStack, prompt: str,
                  max_tokens: int) -> tuple[float, list[float], float]:
    """The same through InvokeEndpoint (signed as boto3 signs; signing not timed)."""
    url = f"{stack.url}/endpoints/ep/invocations"
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    headers = _signed_headers(stack, url, body)
    start = time.perf_counter()
    r = http.post(url, content=body, headers=headers, timeout=120)
    r.raise_for_status()
    return _timings(start, [])


def _signed(http: httpx.Client, stack: UserStack, prompt: str,
            max_tokens: int) -> tuple[float, list[float], float]:
    url = f"{stack.url}/endpoints/ep/invocations-response-stream"
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    headers = _signed_headers(stack, url, body)
    start = time.perf_counter()  # signing is the client's work, as boto3's is: not timed
    marks: list[float] = []
    with http.stream("POST", url, content=body, headers=headers, timeout=120) as r:
        buf = EventStreamBuffer()
        for chunk in r.iter_bytes():
            buf.add_data(chunk)
            for msg in buf:
                for line in msg.payload.decode().splitlines():
                    if line.startswith("data: {") and \
                            json.loads(line[6:])["choices"][0].get("text"):
                        marks.append(time.perf_counter())
    return _timings(start, marks)


def _timings(start: float, marks: list[float]) -> tuple[float, list[float], float]:
    end = time.perf_counter()
    ttft = (marks[0] if marks else end) - start
    return ttft, [b - a for a, b in zip(marks, marks[1:], strict=False)], end - start


Call = Callable[[str], tuple[float, list[float], float]]


def measure(call: Call, n: int, concurrency: int) -> dict[str, float]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(call, [PROMPTS[i % len(PROMPTS)] for i in range(n)]))
    wall = time.perf_counter() - t0
    itl = [x for r in results for x in r[1]]
    return {"req_s": n / wall, "ttft_ms": 1000 * statistics.median(r[0] for r in results),
            "itl_ms": 1000 * statistics.median(itl) if itl else 0.0,
            "e2e_ms": 1000 * statistics.median(r[2] for r in results)}


def deploy(stack: UserStack, target: Path, backend: str = "embedded",
           env: dict[str, str] | None = None) -> tuple[str, str]:
    """Endpoint `ep` of `target`: its model server's URL and instance secret (the server
    answers only requests that carry it: foundation/http/instance_auth.py)."""
    subprocess.run([sys.executable, "-m", "eaglenest.cli", "s3", "cp", str(target),
                    "s3://models/bench/"], env=stack.env(), check=True, capture_output=True,
                   cwd=ROOT)
    sm = stack.client()
    sm.create_model(ModelName="bench", ExecutionRoleArn="arn:aws:iam::123456789012:role/r",
                    PrimaryContainer={"Image": "eaglenest", "Environment": {
                        "EAGLENEST_SERVING_BACKEND": backend, **(env or {})},
                        "ModelDataSource": {"S3DataSource": {
                            "S3Uri": "s3://models/bench/", "S3DataType": "S3Prefix",
                            "CompressionType": "None"}}})
    sm.create_endpoint_config(EndpointConfigName="bench", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "bench", "InstanceType": "ml.g5.2xlarge"}])
    sm.create_endpoint(EndpointName="ep", EndpointConfigName="bench")
    sm.get_waiter("endpoint_in_service").wait(
        EndpointName="ep", WaiterConfig={"Delay": 1, "MaxAttempts": 600})
    from eaglenest.db.session import Database
    from eaglenest.db.tables import EndpointRow

    db = Database(stack.settings.resolved_database_url())
    with db.session() as s:
        row = s.query(EndpointRow).filter_by(name="ep").one()
        instance = row.deployment["Servers"]["AllTraffic"]["instances"][0]
    db.dispose()
    return str(instance["url"]), str(instance["secret"])


def _median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}


def _api_cpu(stack: UserStack) -> float:
    """CPU seconds the API process (`eaglenest api`, a child of `eaglenest up`) has used."""
    assert stack.proc is not None
    for child in psutil.Process(stack.proc.pid).children(recursive=True):
        try:
            if " api " in " ".join(child.cmdline()):
                t = child.cpu_times()
                return float(t.user + t.system)
        except psutil.Error:
            continue
    raise RuntimeError("no API process found")


def _thread_ids(pid: int) -> list[int]:
    """A process's thread ids (sched_setaffinity and setpriority act on one thread id);
    none once it is gone."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _set_affinity(pid: int, cpus: set[int]) -> None:
    """Pin every thread of a process."""
    for tid in _thread_ids(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # gone meanwhile
            continue


def pin(stack: UserStack, server_cpus: set[int]) -> str:
    """Model server(s) on ``server_cpus``, everything else (API, workers, this client) on
    the other cores: a host with cores to spare beside its accelerator, emulated."""
    assert stack.proc is not None
    rest = set(range(os.cpu_count() or 1)) - server_cpus
    if not rest:
        raise SystemExit("--pin-server must leave at least one core to the API and client")
    procs = [psutil.Process(stack.proc.pid), *psutil.Process(stack.proc.pid).children(True)]
    on_server = _server_pids(stack)
    for proc in [*procs, psutil.Process()]:
        _set_affinity(proc.pid, server_cpus if proc.pid in on_server else rest)
    return (f"model server pids {sorted(on_server)} on cpus {sorted(server_cpus)}, "
            f"the rest on {sorted(rest)}")


def _server_pids(stack: UserStack) -> set[int]:
    """The model server processes (and their children, e.g. vLLM's engine core)."""
    assert stack.proc is not None

    def cmd(proc: psutil.Process) -> str:
        try:
            return " ".join(proc.cmdline())
        except psutil.Error:  # exited or a zombie
            return ""

    servers = [p for p in psutil.Process(stack.proc.pid).children(True)
               if any(n in cmd(p) for n in ("eaglenest.workers.model_servers.embedded", "vllm"))]
    return {p.pid for p in servers} | {c.pid for p in servers for c in p.children(True)}


def renice(stack: UserStack, nice: int) -> str:
    """Every thread of the model server(s) at niceness ``nice`` (setpriority acts on one
    thread id on Linux; threads started later inherit it), so that the proxy's wake-ups
    preempt a model server that keeps every core busy."""
    pids = _server_pids(stack)
    for tid in (t for pid in pids for t in _thread_ids(pid)):
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:  # gone meanwhile
            continue
    return f"model server pids {sorted(pids)} at niceness {nice}"


def compare(paths: dict[str, Call], stack: UserStack, requests: int, conc: int,
            rounds: int) -> dict[str, dict[str, float]]:
    """Interleaved rounds (the order reversed every other round), median per figure, after
    a warm-up of every path; `api_cpu_ms` is the API process's CPU per request and
    `proxy_ms` the proxy's own time per request by its /metrics counters, split into
    `forward_ms` (request in -> out to the model server) and `frame_us` (chunk in -> frame
    out, per frame): a caller waits for the forward and one frame relay beyond what the
    model server takes (plus a wake-up of the API's process, which no counter sees)."""
    for call in paths.values():
        measure(call, 8, min(conc, 8))
    got: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
    for i in range(rounds):
        order = list(paths.items())
        for name, call in order if i % 2 == 0 else order[::-1]:
            cpu0, c0 = _api_cpu(stack), runtime_counters(stack.url)
            m = measure(call, requests, conc)
            c1 = runtime_counters(stack.url)
            m["api_cpu_ms"] = 1000 * (_api_cpu(stack) - cpu0) / requests
            m["proxy_ms"] = 1000 * (c1["own"] - c0["own"]) / requests
            m["forward_ms"] = 1000 * (c1["forward"] - c0["forward"]) / requests
            frames = c1["frames"] - c0["frames"]
            relay = c1["own"] - c0["own"] - (c1["forward"] - c0["forward"])
            m["frame_us"] = 1e6 * relay / frames if frames else 0.0
            got[name].append(m)
    return {name: _median_of(r) for name, r in got.items()}


def _report(conc: int, got: dict[str, dict[str, float]], base_name: str,
            names: tuple[str, ...]) -> None:
    for name, m in got.items():
        print(f"{conc:>4}  {name:<7} {m['req_s']:>7.1f} {m['ttft_ms']:>12.1f} "
              f"{m['itl_ms']:>11.2f} {m['e2e_ms']:>11.1f} {m['api_cpu_ms']:>15.2f}"
              f" {m['proxy_ms']:>13.2f} {m['forward_ms']:>11.2f} {m['frame_us']:>9.0f}")
    base = got[base_name]
    for name in names:
        added = got[name]["ttft_ms"] - base["ttft_ms"]
        e2e = got[name]["e2e_ms"] - base["e2e_ms"]
        print(f"      {name}: {added:+.1f} ms TTFT ({100 * added / base['ttft_ms']:+.1f}%)"
              f", {e2e:+.1f} ms per request e2e ({100 * e2e / base['e2e_ms']:+.1f}%)")


def _start_relay(url: str) -> tuple[str, subprocess.Popen[bytes]]:
    """A bare TCP relay (benchmarks.bare_relay) in front of the model server at `url`."""
    from eaglenest.foundation.host.processes import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.bare_relay", "--port",
                             str(port), "--to", url.split("//", 1)[1]], cwd=ROOT)
    for _ in range(100):
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    return f"http://127.0.0.1:{port}", proc


def _run_level(args: argparse.Namespace, stack: UserStack, http: httpx.Client, rt: object,
               url: str, relay: str | None, conc: int) -> None:
    """Every path at one concurrency: streamed, then (--whole) non-streamed."""
    paths: dict[str, Call] = {
        "direct": lambda q: _direct(http, url, q, args.max_tokens),
        "signed": lambda q: _signed(http, stack, q, args.max_tokens),
        "boto3": lambda q: _proxied(rt, q, args.max_tokens)}
    if relay:
        paths["relay"] = lambda q: _direct(http, relay, q, args.max_tokens)
    got = compare(paths, stack, args.requests, conc, args.rounds)
    _report(conc, got, "direct", tuple(n for n in paths if n != "direct"))
    if args.whole:
        paths = {"direct-whole": lambda q: _direct_whole(http, url, q, args.max_tokens),
                 "invoke-whole": lambda q: _invoke_whole(http, stack, q, args.max_tokens)}
        if relay:
            paths["relay-whole"] = lambda q: _direct_whole(http, relay, q, args.max_tokens)
        got = compare(paths, stack, args.requests, conc, args.rounds)
        _report(conc, got, "direct-whole", tuple(n for n in paths if n != "direct-whole"))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--target", type=Path, default=None)
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backend", choices=("embedded", "vllm"), default="embedded",
                   help="the model server behind the endpoint (vllm needs the vllm extra)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="an entry of the model container's Environment (repeatable), e.g. "
                        "OMP_NUM_THREADS=1 so the model server leaves a core to the proxy")
    p.add_argument("--concurrency", default="1,8", help="comma-separated levels")
    p.add_argument("--whole", action="store_true",
                   help="also non-streamed requests: InvokeEndpoint vs the model server's "
                        "/v1/completions (TTFT there is the whole reply)")
    p.add_argument("--pin-server", default=None, metavar="CPUS",
                   help="comma-separated cores for the model server; the API, workers and "
                        "client get the others (use with OMP_NUM_THREADS to match)")
    p.add_argument("--bare-relay", action="store_true",
                   help="also `relay` paths: the same httpx requests through a bare TCP relay "
                        "(benchmarks/bare_relay.py) to the model server: what any extra hop "
                        "costs on this host, without the proxy's work")
    p.add_argument("--nice-server", default=None, metavar="N[,N...]",
                   help="run the model server's threads at niceness N (e.g. 10); several "
                        "levels (e.g. 0,10): the whole table at each, in one run")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="eaglenest-bench-"))
    target = args.target
    if target is None:
        from eaglenest.models.tiny import build_tiny_target

        target = build_tiny_target(tmp / "tiny", "LlamaForCausalLM")
    stack = UserStack(tmp / "stack").start()
    try:
        url, secret = deploy(stack, target, args.backend,
                             dict(kv.split("=", 1) for kv in args.env))
        if args.pin_server:
            print(pin(stack, {int(c) for c in args.pin_server.split(",")}))
        rt = stack.client("sagemaker-runtime")
        # the direct paths carry the instance secret; the signed ones replace that
        # Authorization header with their SigV4 one
        http = httpx.Client(limits=httpx.Limits(max_keepalive_connections=16),
                            headers={"Authorization": f"Bearer {secret}"})
        print(f"median of {args.rounds} interleaved rounds of {args.requests} requests, "
              f"{args.max_tokens} tokens each")
        print("conc  path      req/s   TTFT p50 ms  ITL p50 ms  e2e p50 ms  API CPU ms/req"
              "  proxy ms/req  forward ms  us/frame")
        relay = _start_relay(url) if args.bare_relay else None
        levels = args.nice_server.split(",") if args.nice_server is not None else [None]
        for level in levels:
            if level is not None:
                print(renice(stack, int(level)))
            for conc in (int(c) for c in args.concurrency.split(",")):
                _run_level(args, stack, http, rt, url, relay and relay[0], conc)
        if relay:
            relay[1].terminate()
        http.close()
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
