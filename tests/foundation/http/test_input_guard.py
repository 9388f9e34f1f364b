"""foundation/http/input_guard.py: MAX_INPUT_LENGTH in front of a vLLM server, with the tiny
target's tokenizer: a longer prompt is refused in vLLM's error shape naming the variable and
never reaches the server; a shorter one reaches it with its body intact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from eaglenest.foundation.http import input_guard
from eaglenest.foundation.http.input_guard import InputLengthGuard


class Recorder:
    """The vLLM stand-in: records each body it is handed and answers 200."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        self.bodies.append(b"".join(chunks))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def _client(monkeypatch: pytest.MonkeyPatch, folder: Path | None,
            limit: str) -> tuple[httpx.AsyncClient, Recorder]:
    monkeypatch.setenv(input_guard.LIMIT_ENV, limit)
    monkeypatch.setenv(input_guard.TOKENIZER_ENV, str(folder or ""))
    server = Recorder()
    transport = httpx.ASGITransport(app=InputLengthGuard(server))
    return httpx.AsyncClient(transport=transport, base_url="http://m"), server


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_prompt_over_the_bound_is_refused_by_name(monkeypatch, tiny_llama_dir,
                                                          anyio_backend) -> None:
    client, server = _client(monkeypatch, tiny_llama_dir, "8")
    long = {"model": "m", "prompt": "one two three four five six seven eight nine ten"}
    reply = await client.post("/v1/completions", json=long)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert "MAX_INPUT_LENGTH=8" in error["message"] and error["type"] == "BadRequestError"
    chat = {"model": "m", "messages": [{"role": "user", "content": "hello " * 20}]}
    assert (await client.post("/v1/chat/completions", json=chat)).status_code == 400
    assert (await client.post("/v1/completions", json={"prompt": list(range(9))})
            ).status_code == 400
    assert server.bodies == []  # nothing reached the server
    short = {"model": "m", "prompt": "hi"}
    ok = await client.post("/v1/completions", json=short)
    assert ok.status_code == 200 and json.loads(server.bodies[0]) == short


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_without_a_bound_everything_passes(monkeypatch, anyio_backend) -> None:
    client, server = _client(monkeypatch, None, "")
    body = {"prompt": list(range(10_000))}
    assert (await client.post("/v1/completions", json=body)).status_code == 200
    assert json.loads(server.bodies[0]) == body
