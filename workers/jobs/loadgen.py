"""Load generator against any OpenAI-compatible server (vLLM's or the embedded engine).

For each concurrency level it streams `/v1/completions` requests, measuring per request
TTFT (first text chunk), ITL (gaps between chunks), TPOT ((e2e - TTFT) / (tokens - 1)) and
OTPS (tokens / e2e), and per level the request and output throughput. Acceptance comes
from the spec-decode counters on `/metrics`, read before and after each level:
tau = 1 + accepted / drafts (tokens emitted per target forward, bonus token included).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from eaglenest.workers.model_servers.embedded.metrics import parse_spec_counters


@dataclass
class RequestResult:
    ttft: float
    e2e: float
    output_tokens: int
    itl: list[float] = field(default_factory=list)
    text: str = ""

    @property
    def tpot(self) -> float:
        return (self.e2e - self.ttft) / max(self.output_tokens - 1, 1)


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    duration_s: float
    ttft_ms_p50: float
    ttft_ms_p90: float
    tpot_ms_p50: float
    itl_ms_p50: float
    e2e_ms_p50: float
    request_throughput: float
    output_throughput: float
    otps_per_request: float
    output_tokens: int
    acceptance_length: float | None
    drafts: float
    accepted: float
    ttft_ms_p99: float = 0.0
    tpot_ms_p99: float = 0.0


@dataclass
class BenchConfig:
    base_url: str
    model: str
    prompts: list[str]
    concurrencies: tuple[int, ...] = (1, 2, 4, 8)
    max_tokens: int = 64
    requests_per_level: int | None = None  # default: max(len(prompts), 2 * concurrency)
    temperature: float = 0.0
    timeout_s: float = 600.0
    #: the server's instance secret (foundation/http/instance_auth.py), sent as a bearer token
    api_key: str | None = None


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def _one(client: httpx.AsyncClient, cfg: BenchConfig, prompt: str) -> RequestResult:
    body = {"model": cfg.model, "prompt": prompt, "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first: float | None = None
    last = start
    itl: list[float] = []
    tokens = 0
    text: list[str] = []
    async with client.stream("POST", f"{cfg.base_url}/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            pieces = [c.get("text") or "" for c in chunk.get("choices", [])]
            if any(pieces):
                text += pieces
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    itl.append(now - last)
                last = now
    end = time.perf_counter()
    return RequestResult(ttft=(first or end) - start, e2e=end - start, output_tokens=tokens,
                         itl=itl, text="".join(text))


async def _spec(client: httpx.AsyncClient, base_url: str) -> dict[str, float]:
    try:
        r = await client.get(f"{base_url}/metrics")
        return parse_spec_counters(r.text) if r.status_code == 200 else {}
    except httpx.HTTPError:
        return {}


async def run_level(client: httpx.AsyncClient, cfg: BenchConfig, concurrency: int) -> LevelResult:
    return (await run_level_texts(client, cfg, concurrency))[0]


async def run_level_texts(client: httpx.AsyncClient, cfg: BenchConfig, concurrency: int,
                          ) -> tuple[LevelResult, list[str]]:
    """The level's figures and every request's text (in prompt order, prompts cycled)."""
    n = cfg.requests_per_level or max(len(cfg.prompts), 2 * concurrency)
    prompts = [cfg.prompts[i % len(cfg.prompts)] for i in range(n)]
    sem = asyncio.Semaphore(concurrency)

    async def bounded(p: str) -> RequestResult:
        async with sem:
            return await _one(client, cfg, p)

    before = await _spec(client, cfg.base_url)
    t0 = time.perf_counter()
    results = await asyncio.gather(*(bounded(p) for p in prompts))
    duration = time.perf_counter() - t0
    after = await _spec(client, cfg.base_url)
    return summarise(concurrency, results, duration, before, after), [r.text for r in results]


def summarise(concurrency: int, results: list[RequestResult], duration: float,
              before: dict[str, float], after: dict[str, float]) -> LevelResult:
    drafts = after.get("drafts", 0.0) - before.get("drafts", 0.0)
    accepted = after.get("accepted", 0.0) - before.get("accepted", 0.0)
    tokens = sum(r.output_tokens for r in results)
    itls = [x for r in results for x in r.itl]
    return LevelResult(
        concurrency=concurrency, requests=len(results), duration_s=duration,
        ttft_ms_p50=1000 * _pct([r.ttft for r in results], 0.5),
        ttft_ms_p90=1000 * _pct([r.ttft for r in results], 0.9),
        tpot_ms_p50=1000 * _pct([r.tpot for r in results], 0.5),
        itl_ms_p50=1000 * _pct(itls, 0.5),
        e2e_ms_p50=1000 * _pct([r.e2e for r in results], 0.5),
        request_throughput=len(results) / duration,
        output_throughput=tokens / duration,
        otps_per_request=statistics.mean(r.output_tokens / r.e2e for r in results),
        output_tokens=tokens,
        acceptance_length=(1 + accepted / drafts) if drafts > 0 else None,
        drafts=drafts, accepted=accepted,
        ttft_ms_p99=1000 * _pct([r.ttft for r in results], 0.99),
        tpot_ms_p99=1000 * _pct([r.tpot for r in results], 0.99),
    )


def pool(rounds: list[LevelResult]) -> LevelResult:
    """One level measured in several rounds, as one row: counts and times add up (throughput =
    all tokens / all time), p50s are the rounds' median, p90/p99 their maximum (a tail seen in
    any round counts), acceptance from the summed counters."""
    if len(rounds) == 1:
        return rounds[0]
    duration = sum(r.duration_s for r in rounds)
    tokens = sum(r.output_tokens for r in rounds)
    drafts = sum(r.drafts for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    requests = sum(r.requests for r in rounds)

    def med(name: str) -> float:
        return float(statistics.median(getattr(r, name) for r in rounds))

    def top(name: str) -> float:
        return max(float(getattr(r, name)) for r in rounds)

    return LevelResult(
        concurrency=rounds[0].concurrency, requests=requests, duration_s=duration,
        ttft_ms_p50=med("ttft_ms_p50"), ttft_ms_p90=top("ttft_ms_p90"),
        tpot_ms_p50=med("tpot_ms_p50"), itl_ms_p50=med("itl_ms_p50"),
        e2e_ms_p50=med("e2e_ms_p50"), request_throughput=requests / duration,
        output_throughput=tokens / duration,
        otps_per_request=statistics.mean(r.otps_per_request for r in rounds),
        output_tokens=tokens,
        acceptance_length=(1 + accepted / drafts) if drafts > 0 else None,
        drafts=drafts, accepted=accepted,
        ttft_ms_p99=top("ttft_ms_p99"), tpot_ms_p99=top("tpot_ms_p99"))


async def run(cfg: BenchConfig) -> list[LevelResult]:
    auth = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    async with httpx.AsyncClient(timeout=cfg.timeout_s, headers=auth) as client:
        return [await run_level(client, cfg, c) for c in cfg.concurrencies]


def to_markdown(rows: dict[str, list[LevelResult]]) -> str:
    """SageMaker's benchmark table columns plus acceptance length, one row per level."""
    head = ("| config | concurrency | TTFT p50 (ms) | TPOT p50 (ms) | ITL p50 (ms) | "
            "request throughput (req/s) | output throughput (tok/s) | OTPS per request | "
            "acceptance length |")
    lines = [head, "|" + "---|" * 9]
    for name, levels in rows.items():
        for r in levels:
            tau = f"{r.acceptance_length:.2f}" if r.acceptance_length else "-"
            lines.append(
                f"| {name} | {r.concurrency} | {r.ttft_ms_p50:.1f} | {r.tpot_ms_p50:.1f} | "
                f"{r.itl_ms_p50:.1f} | {r.request_throughput:.2f} | {r.output_throughput:.1f} | "
                f"{r.otps_per_request:.1f} | {tau} |"
            )
    return "\n".join(lines) + "\n"


def to_json(rows: dict[str, list[LevelResult]], **meta: Any) -> dict[str, Any]:
    return {**meta, "results": {k: [asdict(r) for r in v] for k, v in rows.items()}}
