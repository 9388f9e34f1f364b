"""Proxy overhead: sagemaker-runtime (boto3, SigV4, event-stream) vs the model server's own
OpenAI API, same endpoint, same prompts, concurrency 1 and 8, side by side in one run.

    python -m benchmarks.endpoint [--target DIR] [--requests 40] [--max-tokens 16]
                                  [--rounds 3]

Without --target a tiny random Llama is built (tests/models/tiny.py): its forward is cheap,
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
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "models"))

from eaglenest_testing import Stack  # noqa: E402

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


def _timings(start: float, marks: list[float]) -> tuple[float, list[float], float]:
    end = time.perf_counter()
    ttft = (marks[0] if marks else end) - start
    return ttft, [b - a for a, b in zip(marks, marks[1:], strict=False)], end - start


def measure(call: object, n: int, concurrency: int) -> dict[str, float]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(call, [PROMPTS[i % len(PROMPTS)] for i in range(n)]))  # type: ignore[arg-type]
    wall = time.perf_counter() - t0
    itl = [x for r in results for x in r[1]]
    return {"req_s": n / wall, "ttft_ms": 1000 * statistics.median(r[0] for r in results),
            "itl_ms": 1000 * statistics.median(itl) if itl else 0.0,
            "e2e_ms": 1000 * statistics.median(r[2] for r in results)}


def deploy(stack: Stack, target: Path) -> str:
    import subprocess

    env = {**stack.env()}
    subprocess.run([sys.executable, "-m", "workers.cli", "s3", "cp", str(target),
                    "s3://models/bench/"], env=env, check=True, capture_output=True, cwd=ROOT)
    sm = stack.client()
    sm.create_model(ModelName="bench", ExecutionRoleArn="arn:aws:iam::123456789012:role/r",
                    PrimaryContainer={"Image": "eaglenest", "Environment": {
                        "EAGLENEST_SERVING_BACKEND": "embedded"},
                        "ModelDataSource": {"S3DataSource": {
                            "S3Uri": "s3://models/bench/", "S3DataType": "S3Prefix",
                            "CompressionType": "None"}}})
    sm.create_endpoint_config(EndpointConfigName="bench", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "bench", "InstanceType": "ml.g5.2xlarge"}])
    sm.create_endpoint(EndpointName="ep", EndpointConfigName="bench")
    sm.get_waiter("endpoint_in_service").wait(
        EndpointName="ep", WaiterConfig={"Delay": 1, "MaxAttempts": 600})
    from db.session import Database
    from db.tables import EndpointRow

    db = Database(stack.database_url)
    with db.session() as s:
        row = s.query(EndpointRow).filter_by(name="ep").one()
        url = str(row.deployment["Servers"]["AllTraffic"]["instances"][0]["url"])
    db.dispose()
    return url


def _median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}


def compare(direct: object, proxied: object, requests: int, conc: int,
            rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """Interleaved rounds (ABBA...), median per figure, after a warm-up of both paths."""
    measure(direct, 8, min(conc, 8))
    measure(proxied, 8, min(conc, 8))
    got: dict[str, list[dict[str, float]]] = {"direct": [], "runtime": []}
    for i in range(rounds):
        order = (("direct", direct), ("runtime", proxied))
        for name, call in order if i % 2 == 0 else order[::-1]:
            got[name].append(measure(call, requests, conc))
    return _median_of(got["direct"]), _median_of(got["runtime"])


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--target", type=Path, default=None)
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="eaglenest-bench-"))
    target = args.target
    if target is None:
        from tiny import build_tiny_target

        target = build_tiny_target(tmp / "tiny", "LlamaForCausalLM")
    (tmp / "stack").mkdir()
    stack = Stack(tmp / "stack").start()
    try:
        url = deploy(stack, target)
        rt = stack.client("sagemaker-runtime")
        http = httpx.Client(limits=httpx.Limits(max_keepalive_connections=16))
        print(f"median of {args.rounds} interleaved rounds of {args.requests} requests, "
              f"{args.max_tokens} tokens each")
        print("conc  path        req/s   TTFT p50 ms  ITL p50 ms  e2e p50 ms")
        for conc in (1, 8):
            direct, proxied = compare(
                lambda q: _direct(http, url, q, args.max_tokens),
                lambda q: _proxied(rt, q, args.max_tokens), args.requests, conc, args.rounds)
            for name, m in (("direct", direct), ("runtime", proxied)):
                print(f"{conc:>4}  {name:<9} {m['req_s']:>7.1f} {m['ttft_ms']:>12.1f} "
                      f"{m['itl_ms']:>11.2f} {m['e2e_ms']:>11.1f}")
            added = proxied["ttft_ms"] - direct["ttft_ms"]
            e2e = proxied["e2e_ms"] - direct["e2e_ms"]
            print(f"      proxy adds {added:+.1f} ms TTFT ({100 * added / direct['ttft_ms']:+.1f}%)"
                  f", {e2e:+.1f} ms per request e2e ({100 * e2e / direct['e2e_ms']:+.1f}%)")
        http.close()
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
