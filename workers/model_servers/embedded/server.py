"""vLLM's OpenAI-compatible surface over the embedded engine.

Routes: /health, /v1/models, /v1/completions, /v1/chat/completions (both with SSE
streaming and `stream_options.include_usage`), /metrics (vLLM's metric names).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from eaglenest.workers.model_servers.embedded import limits
from eaglenest.workers.model_servers.embedded.generation import Engine, Runner
from eaglenest.workers.model_servers.embedded.generation import Request as GenRequest
from eaglenest.workers.model_servers.embedded.metrics import ServerMetrics


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = None  # checked as vLLM checks it (embedded/limits.py)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    seed: int | None = None


class CompletionBody(_Common):
    prompt: str | list[int]


class ChatBody(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = None


def error(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    """vLLM's error body (0.32: `{"error": {message, type, param, code}}`)."""
    kind = "BadRequestError" if status == 400 else "NotFoundError"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": status}}, status_code=status)


class EmbeddedServer:
    def __init__(self, engine: Engine, tokenizer: Any, model_name: str,
                 max_model_len: int = 4096, default_max_tokens: int = 256,
                 max_input_length: int | None = None) -> None:
        self.tokenizer, self.model_name = tokenizer, model_name
        self.max_input_length = max_input_length
        self.max_model_len, self.default_max_tokens = max_model_len, default_max_tokens
        self.chars_per_token = limits.max_chars_per_token(tokenizer)
        self.metrics = ServerMetrics(model_name)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.runner = Runner(engine, tokenizer, self.metrics, (eos,) if eos is not None else ())

    def _request(self, body: _Common, prompt_ids: list[int], max_tokens: int | None) -> GenRequest:
        """The engine request, once the prompt passed `limits` (rules 3 and 4)."""
        limits.check_tokens(len(prompt_ids), self.max_model_len)
        limits.check_input(len(prompt_ids), self.max_input_length)
        budget = limits.output_budget(len(prompt_ids), max_tokens, self.default_max_tokens,
                                      self.max_model_len)
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        return GenRequest(prompt_ids, budget, body.temperature, body.top_p, stop, body.seed)

    def _encode(self, text: str) -> list[int]:
        """At most max_model_len + 1 tokens of `text` (rule 2 first: a text no prompt of
        max_model_len tokens can be is refused untokenized)."""
        limits.check_text(text, self.max_model_len, self.chars_per_token)
        return list(self.tokenizer(text, add_special_tokens=False, truncation=True,
                                   max_length=self.max_model_len + 1)["input_ids"])

    def completion_ids(self, body: CompletionBody) -> list[int]:
        if isinstance(body.prompt, list):
            return list(body.prompt)
        return self._encode(body.prompt)

    def chat_ids(self, body: ChatBody) -> list[int]:
        text = self.tokenizer.apply_chat_template(body.messages, add_generation_prompt=True,
                                                  tokenize=False)
        return self._encode(str(text))


def _envelope(kind: str, rid: str, model: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model,
            "choices": choices}


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


async def _sse(srv: EmbeddedServer, req: GenRequest, chat: bool, include_usage: bool,
               rid: str) -> AsyncIterator[bytes]:
    kind = "chat.completion.chunk" if chat else "text_completion"
    if chat:
        first = {"index": 0, "delta": {"role": "assistant", "content": ""},
                 "finish_reason": None}
        yield f"data: {json.dumps(_envelope(kind, rid, srv.model_name, [first]))}\n\n".encode()
    tokens = 0
    async for d in srv.runner.stream(req):
        tokens = d.completion_tokens
        choice: dict[str, Any] = {"index": 0, "finish_reason": d.finish_reason}
        if chat:
            choice["delta"] = {"content": d.text} if d.text else {}
        else:
            choice["text"] = d.text
        chunk = _envelope(kind, rid, srv.model_name, [choice])
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    if include_usage:
        chunk = _envelope(kind, rid, srv.model_name, [])
        chunk["usage"] = _usage(len(req.prompt_ids), tokens)
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    yield b"data: [DONE]\n\n"


async def _respond(srv: EmbeddedServer, body: _Common, req: GenRequest, chat: bool) -> Any:
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    if body.stream:
        usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_sse(srv, req, chat, usage, rid), media_type="text/event-stream")
    text, finish, tokens = await srv.runner.complete(req)
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    kind = "chat.completion" if chat else "text_completion"
    out = _envelope(kind, rid, srv.model_name, [choice])
    out["usage"] = _usage(len(req.prompt_ids), tokens)
    return JSONResponse(out)


def create_server_app(srv: EmbeddedServer) -> FastAPI:
    app = FastAPI(title="EagleNest embedded engine", docs_url=None, redoc_url=None)

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": srv.model_name, "object": "model",
                                            "owned_by": "eaglenest",
                                            "max_model_len": srv.max_model_len}]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(srv.metrics.render(), media_type="text/plain; version=0.0.4")

    async def handle(request: Request, chat: bool) -> Any:
        """Validate, check the limits (embedded/limits.py), then hand to the engine."""
        try:
            raw = await request.json()
            body: _Common = (ChatBody if chat else CompletionBody).model_validate(raw)
            if body.model and body.model != srv.model_name:
                return error(f"The model `{body.model}` does not exist.", 404)
            if chat:
                cb = ChatBody.model_validate(raw)
                wanted, param = ((cb.max_completion_tokens, "max_completion_tokens")
                                 if cb.max_completion_tokens is not None
                                 else (cb.max_tokens, "max_tokens"))
                limits.check_output(wanted, param, srv.max_model_len)
                req = srv._request(cb, srv.chat_ids(cb), wanted)
            else:
                pb = CompletionBody.model_validate(raw)
                limits.check_output(pb.max_tokens, "max_tokens", srv.max_model_len)
                req = srv._request(pb, srv.completion_ids(pb), pb.max_tokens)
        except limits.LimitError as exc:
            return error(str(exc), param=exc.param)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            return error(str(exc).splitlines()[0] if "validation error" not in str(exc)
                         else str(exc).replace("\n", " "))
        return await _respond(srv, body, req, chat)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        return await handle(request, chat=True)

    return app
