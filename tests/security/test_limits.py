"""Prompt length and max_new_tokens are checked against the model's limits before any work
starts: the model server refuses what is over them with a 400 in vLLM's words
(workers/model_servers/embedded/limits.py), which the caller gets as SageMaker reports a
container's 4xx (ModelError 424, OriginalStatusCode 400, the container's message), for
InvokeEndpoint and, before any chunk, for the streaming variant. A refused request never
reaches the engine: its counters do not move and a request beside it is served as alone.

`check_limits` is shared with the vLLM backend's test (tests/workers/serving/
test_vllm_endpoint.py, `-m vllm`): both backends give the same client-visible result."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

from tests.security.conftest import SERVING_ENV, instances
from tests.support.stack import Stack

MAX_MODEL_LEN = int(SERVING_ENV["EAGLENEST_MAX_MODEL_LEN"])


def chars_per_token(model_dir: Path) -> int:
    """vLLM's upper bound on one token's characters: the longest vocabulary entry."""
    from transformers import AutoTokenizer

    return max(len(t) for t in AutoTokenizer.from_pretrained(model_dir).get_vocab())


def limit_cases(max_model_len: int, chars: int) -> list[tuple[str, dict[str, Any], str]]:
    """(what, OpenAI or LMI body, the container's message) for requests over the limits."""
    over = max_model_len + 1
    long_prompt = "hello " * (2 * max_model_len)  # over the tokens, under the characters
    huge = "x" * (max_model_len * chars + 1)
    return [
        ("max_tokens over the limit", {"prompt": "hi", "max_tokens": 5000},
         f"max_tokens=5000 cannot be greater than max_model_len={max_model_len}. Please "
         f"request fewer output tokens. (parameter=max_tokens, value=5000)"),
        ("LMI max_new_tokens over the limit",
         {"inputs": "hi", "parameters": {"max_new_tokens": 5000}},
         f"max_tokens=5000 cannot be greater than max_model_len={max_model_len}."),
        ("chat max_completion_tokens over the limit",
         {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": over},
         f"max_completion_tokens={over} cannot be greater than max_model_len="
         f"{max_model_len}. Please request fewer output tokens."),
        ("max_tokens zero", {"prompt": "hi", "max_tokens": 0},
         "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"),
        ("prompt over the context", {"prompt": long_prompt, "max_tokens": 4},
         f"This model's maximum context length is {max_model_len} tokens. However, your "
         f"prompt contains at least {over} input tokens, which exceeds this limit even "
         f"without any output tokens. Please reduce the length of the input prompt. "
         f"(parameter=input_tokens, value={over})"),
        ("LMI prompt over the context", {"inputs": long_prompt},
         f"This model's maximum context length is {max_model_len} tokens. However, your "
         f"prompt contains at least {over} input tokens"),
        ("prompt text no context can hold", {"prompt": huge, "max_tokens": 4},
         f"This model's maximum context length is {max_model_len} tokens. However, your "
         f"prompt contains {len(huge)} characters (more than {max_model_len * chars} "
         f"characters, which is the upper bound for {max_model_len} input tokens). Please "
         f"reduce the length of the input prompt. (parameter=input_text, value={len(huge)})"),
    ]


def model_error(call: Any, **kw: Any) -> dict[str, Any]:
    with pytest.raises(ClientError) as exc:
        call(**kw)
    r = exc.value.response
    assert (r["Error"]["Code"], r["ResponseMetadata"]["HTTPStatusCode"]) == ("ModelError", 424)
    assert r["OriginalStatusCode"] == 400, r
    assert r["Error"]["Message"].startswith('Received client error (400) from primary')
    return r


def check_limits(stack: Stack, endpoint: str, max_model_len: int, chars: int) -> None:
    """Every over-limit request is refused the same way by InvokeEndpoint and the stream;
    a prompt whose output would overflow the context is served with its output cut to fit
    (vLLM clamps max_tokens, it does not refuse it)."""
    rt = stack.client("sagemaker-runtime")
    for what, body, message in limit_cases(max_model_len, chars):
        for call in (rt.invoke_endpoint, rt.invoke_endpoint_with_response_stream):
            r = model_error(call, EndpointName=endpoint, ContentType="application/json",
                            Body=json.dumps(body))
            original = json.loads(r["OriginalMessage"])["error"]
            assert original["code"] == 400 and original["type"] == "BadRequestError", what
            assert original["message"].startswith(message), (what, original)

    def usage(prompt: str, max_tokens: int) -> dict[str, int]:
        out = rt.invoke_endpoint(EndpointName=endpoint, ContentType="application/json",
                                 Body=json.dumps({"prompt": prompt, "max_tokens": max_tokens,
                                                  "temperature": 0, "ignore_eos": True}))
        return dict(json.loads(out["Body"].read())["usage"])

    # a prompt about 16 tokens short of the context (sized from a 20-word probe), so the
    # clamped output is short enough for a CPU to produce within the proxy's read timeout
    per_word = usage("hello " * 20, 1)["prompt_tokens"] / 20
    words = int((max_model_len - 16) / per_word)
    got = usage("hello " * words, max_model_len)
    # max_tokens clamped to what the context has left, every token of it produced
    assert got["prompt_tokens"] < max_model_len, got
    assert got["completion_tokens"] == max_model_len - got["prompt_tokens"], got


def test_over_the_limits_is_the_containers_400(secure: Stack, served: str,
                                               tiny_llama_dir: Path) -> None:
    check_limits(secure, served, MAX_MODEL_LEN, chars_per_token(tiny_llama_dir))


def test_lmi_max_new_tokens_must_be_a_positive_integer(secure: Stack, served: str) -> None:
    rt = secure.client("sagemaker-runtime")
    for value in (0, -3, 2.5, "8", True):
        r = model_error(rt.invoke_endpoint, EndpointName=served, ContentType="application/json",
                        Body=json.dumps({"inputs": "hi", "parameters": {"max_new_tokens": value}}))
        assert "'parameters.max_new_tokens' must be a positive integer." in \
            r["OriginalMessage"], value


def engine_counters(secure: Stack, endpoint: str) -> dict[str, float]:
    (inst,) = instances(secure, endpoint)
    text = httpx.get(f"{inst['url']}/metrics", timeout=10,
                     headers={"Authorization": f"Bearer {inst['secret']}"}).text
    wanted = ("vllm:prompt_tokens_total", "vllm:request_success_total",
              "vllm:generation_tokens_total")
    return {line.split("{")[0]: float(line.rpartition(" ")[2]) for line in text.splitlines()
            if line.split("{")[0] in wanted}


def test_refused_requests_never_reach_the_engine(secure: Stack, served: str) -> None:
    """Over-long requests sent while a normal one runs: they are refused, the normal one
    gets the same text as alone, and the engine's counters show only the normal ones."""
    rt = secure.client("sagemaker-runtime")
    normal = json.dumps({"inputs": "Natalia sold 48 clips",
                         "parameters": {"max_new_tokens": 48, "temperature": 0}})

    def generate() -> str:
        out = rt.invoke_endpoint(EndpointName=served, ContentType="application/json",
                                 Body=normal)
        return str(json.loads(out["Body"].read())["generated_text"])

    start = engine_counters(secure, served)
    alone = generate()
    before = engine_counters(secure, served)
    beside: list[str] = []
    worker = threading.Thread(target=lambda: beside.append(generate()))
    worker.start()
    for _ in range(8):
        for body in ({"inputs": "hello " * (4 * MAX_MODEL_LEN)},
                     {"prompt": "hi", "max_tokens": 10 * MAX_MODEL_LEN}):
            model_error(rt.invoke_endpoint, EndpointName=served,
                        ContentType="application/json", Body=json.dumps(body))
    worker.join(timeout=120)
    assert beside == [alone]
    after = engine_counters(secure, served)
    assert len(after) == 3
    for name, value in after.items():  # exactly what the normal request alone added
        assert value - before[name] == before[name] - start[name], name
