"""The embedded engine's server, started as a real process like the endpoint manager and
the benchmark start it: vLLM's OpenAI surface, streaming, metrics, lossless greedy."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest

from eaglenest.foundation.host.processes import free_port
from eaglenest.foundation.host.threads import plan_threads
from eaglenest.workers.jobs.loadgen import BenchConfig, run
from eaglenest.workers.model_servers.embedded.metrics import (
    parse_rounds_by_k,
    parse_spec_counters,
    parse_steps_by_decoding,
    parse_torch_threads,
)
from eaglenest.workers.model_servers.process import EMBEDDED, ServerProcess, ServerSpec
from eaglenest.workers.model_servers.schedule import Schedule

PROMPTS = ["Natalia sold 48 clips", "def add(a, b):", "The quick brown fox"]
LENGTHS = [24, 5, 17, 9, 30, 2]  # different lengths: requests leave the batch at different steps


def _start(tmp_path, model_dir, head_dir, name: str) -> ServerProcess:
    spec = ServerSpec(model_dir=model_dir, served_name="tiny", port=free_port(),
                      backend=EMBEDDED, head_dir=head_dir, num_speculative_tokens=3,
                      max_model_len=256)
    proc = ServerProcess(spec, tmp_path / f"{name}.log")
    proc.start(health_timeout=120)
    return proc


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tiny_llama_dir, tiny_eagle3_dir) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("servers")
    base = _start(tmp, tiny_llama_dir, None, "base")
    spec = _start(tmp, tiny_llama_dir, tiny_eagle3_dir, "spec")
    yield {"base": base.base_url, "spec": spec.base_url}
    base.stop()
    spec.stop()


def complete(url: str, prompt: str, **kw: object) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0, **kw}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


async def completion_text(client: httpx.AsyncClient, url: str, prompt: str, n: int,
                          stream: bool) -> str:
    """A greedy completion's text, from the JSON reply or put together from the SSE chunks."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0,
            "stream": stream}
    if not stream:
        r = await client.post(f"{url}/v1/completions", json=body)
        return str(r.json()["choices"][0]["text"])
    text = ""
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text += "".join(c["text"] for c in json.loads(line[6:])["choices"])
    return text


def test_health_and_models(servers):
    for url in servers.values():
        assert httpx.get(f"{url}/health").status_code == 200
        models = httpx.get(f"{url}/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["tiny"]


def test_greedy_output_is_lossless(servers):
    for prompt in PROMPTS:
        base = complete(servers["base"], prompt)
        spec = complete(servers["spec"], prompt)
        assert spec["choices"][0]["text"] == base["choices"][0]["text"]
        assert spec["usage"] == base["usage"]
        assert base["usage"]["completion_tokens"] > 0


def test_spec_counters_on_metrics(servers):
    complete(servers["spec"], PROMPTS[0])
    spec = parse_spec_counters(httpx.get(f"{servers['spec']}/metrics").text)
    assert spec["drafts"] > 0
    assert spec["draft_tokens"] >= spec["drafts"]
    assert 0 <= spec["accepted"] <= spec["draft_tokens"]
    base = parse_spec_counters(httpx.get(f"{servers['base']}/metrics").text)
    assert base.get("drafts", 0) == 0


def test_streaming_matches_non_streaming(servers):
    url = servers["spec"]
    whole = complete(url, PROMPTS[1])["choices"][0]["text"]
    body = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 24, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    pieces, usage = [], None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                pieces += [c["text"] for c in chunk["choices"]]
    assert "".join(pieces) == whole
    assert usage is not None and usage["completion_tokens"] > 0


def test_chat_and_stop_strings(servers):
    url = servers["base"]
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 16, "temperature": 0})
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    assert msg["role"] == "assistant"
    full = complete(url, PROMPTS[2])["choices"][0]["text"]
    if len(full) > 4:
        stop = full[2:4]
        cut = complete(url, PROMPTS[2], stop=[stop])
        assert cut["choices"][0]["text"] == full[: full.index(stop)]
        assert cut["choices"][0]["finish_reason"] == "stop"


def test_bad_requests(servers):
    url = servers["base"]
    r = httpx.post(f"{url}/v1/completions", json={"model": "other", "prompt": "x"})
    assert r.status_code == 404
    r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "x",
                                                   "max_tokens": 0})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
        "type": "BadRequestError", "param": "max_tokens", "code": 400}


def test_benchmark_against_both(servers):
    rows = {}
    for name, url in servers.items():
        cfg = BenchConfig(base_url=url, model="tiny", prompts=PROMPTS, concurrencies=(1, 2),
                          max_tokens=16)
        rows[name] = asyncio.run(run(cfg))
    for levels in rows.values():
        assert [r.concurrency for r in levels] == [1, 2]
        for r in levels:
            assert r.output_tokens > 0 and r.output_throughput > 0
            assert 0 < r.ttft_ms_p50 <= r.e2e_ms_p50
    assert rows["base"][0].acceptance_length is None
    assert rows["spec"][0].acceptance_length is not None
    assert rows["spec"][0].acceptance_length >= 1.0


def test_concurrent_requests_equal_sequential(servers):
    """Concurrent requests are decoded together (continuous batching) with the same text,
    streaming or not, and the spec-decode counters keep adding up."""
    async def together(url: str) -> list[str]:
        async with httpx.AsyncClient(timeout=120) as client:
            jobs = [completion_text(client, url, p, n, i % 2 == 1)
                    for i, (p, n) in enumerate(zip(PROMPTS * 2, LENGTHS, strict=True))]
            return list(await asyncio.gather(*jobs))

    for name, url in servers.items():
        before = parse_spec_counters(httpx.get(f"{url}/metrics").text)
        sequential = [complete(url, p, max_tokens=n)["choices"][0]["text"]
                      for p, n in zip(PROMPTS * 2, LENGTHS, strict=True)]
        middle = parse_spec_counters(httpx.get(f"{url}/metrics").text)
        assert asyncio.run(together(url)) == sequential, name
        after = parse_spec_counters(httpx.get(f"{url}/metrics").text)
        if name == "spec":  # greedy: the same rounds, counted once each
            for key in ("drafts", "draft_tokens", "accepted"):
                assert after[key] - middle[key] == middle[key] - before.get(key, 0), key


def test_adaptive_server_is_lossless_alone_and_batched(servers, tmp_path, tiny_llama_dir,
                                                       tiny_eagle3_dir):
    """EAGLENEST_ADAPTIVE=1 endpoints run the server with --adaptive: K chosen per round (K = 0
    included) must not change a greedy token, one request at a time or several together."""
    spec = ServerSpec(model_dir=tiny_llama_dir, served_name="tiny", port=free_port(),
                      backend=EMBEDDED, head_dir=tiny_eagle3_dir, num_speculative_tokens=3,
                      max_model_len=256, adaptive=True)
    assert "--adaptive" in spec.command()
    proc = ServerProcess(spec, tmp_path / "adaptive.log")
    proc.start(health_timeout=120)
    try:
        url = proc.base_url
        want = [complete(servers["base"], p, max_tokens=n)["choices"][0]["text"]
                for p, n in zip(PROMPTS * 2, LENGTHS, strict=True)]
        alone = [complete(url, p, max_tokens=n)["choices"][0]["text"]
                 for p, n in zip(PROMPTS * 2, LENGTHS, strict=True)]
        assert alone == want

        async def together() -> list[str]:
            async with httpx.AsyncClient(timeout=120) as client:
                replies = await asyncio.gather(*[client.post(f"{url}/v1/completions", json={
                    "model": "tiny", "prompt": p, "max_tokens": n, "temperature": 0})
                    for p, n in zip(PROMPTS * 2, LENGTHS, strict=True)])
            return [r.json()["choices"][0]["text"] for r in replies]

        assert asyncio.run(together()) == want
        assert parse_spec_counters(httpx.get(f"{url}/metrics").text)["drafts"] > 0
    finally:
        proc.stop()


def test_scheduled_server_switches_decoding_and_k_with_the_running_requests(
        servers, tmp_path, tiny_llama_dir, tiny_eagle3_dir):
    """A schedule [[1, 3, "tree"], [2, 2, "chain"], [64, 0]]: a depth-3 tree while one
    request runs, chain K=2 with two, plain steps from three on, counted per K and per
    decoding on /metrics; greedy text equals the plain server's either way."""
    spec = ServerSpec(model_dir=tiny_llama_dir, served_name="tiny", port=free_port(),
                      backend=EMBEDDED, head_dir=tiny_eagle3_dir, num_speculative_tokens=3,
                      max_model_len=256,
                      schedule=Schedule(((1, 3, "tree"), (2, 2, "chain"), (64, 0))),
                      extra_env={"EAGLENEST_COMPUTE_SHARING": "2"})
    proc = ServerProcess(spec, tmp_path / "scheduled.log")
    proc.start(health_timeout=120)
    try:
        url = proc.base_url
        # started as one of two compute processes: half the usable CPUs, on /metrics
        want_threads = plan_threads(2).threads
        assert proc.threads is not None and proc.threads.threads == want_threads
        assert parse_torch_threads(httpx.get(f"{url}/metrics").text) == want_threads
        jobs = list(zip(PROMPTS * 2, LENGTHS, strict=True))
        want = [complete(servers["base"], p, max_tokens=n)["choices"][0]["text"] for p, n in jobs]
        alone = [complete(url, p, max_tokens=n)["choices"][0]["text"] for p, n in jobs]
        assert alone == want
        page = httpx.get(f"{url}/metrics").text
        rounds = parse_rounds_by_k(page)
        assert rounds.get(3, 0) > 0 and set(rounds) == {3}, rounds
        assert parse_spec_counters(page)["drafts"] > 0
        # one request at a time: every step a tree, none chain or plain
        assert parse_steps_by_decoding(page) == {"tree": rounds[3]}

        async def together() -> list[str]:
            async with httpx.AsyncClient(timeout=120) as client:
                replies = await asyncio.gather(*[client.post(f"{url}/v1/completions", json={
                    "model": "tiny", "prompt": p, "max_tokens": n, "temperature": 0})
                    for p, n in jobs])
            return [r.json()["choices"][0]["text"] for r in replies]

        assert asyncio.run(together()) == want
        page = httpx.get(f"{url}/metrics").text
        after = parse_rounds_by_k(page)
        assert after.get(0, 0) > 0, after  # plain steps while several ran
        assert set(after) <= {0, 2, 3}
        # K=3 only in tree steps, K=2 only in chain steps: the two counters agree
        steps = parse_steps_by_decoding(page)
        assert steps == {name: after[k] for name, k in
                         (("plain", 0), ("chain", 2), ("tree", 3)) if k in after}, steps
    finally:
        proc.stop()
