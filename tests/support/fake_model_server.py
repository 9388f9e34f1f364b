"""A stand-in model server for router tests: vLLM's routes that a router relays, answering
with its own name (`--name`), guarded by the instance's secret as vLLM is.

POST /v1/completions with {"delay": s} answers after s seconds: {"server": name, "body":
the request}; with "stream": true, three SSE events a tenth of a second apart (fewer when
"max_tokens" is less), each {"server", "i"} plus an OpenAI completion chunk's fields (one
token of text in choices[0].text, as vLLM streams), then, when "stream_options" asks
"include_usage", a last chunk with no choices and its "usage" (completion_tokens: the
chunks sent), as workers/jobs/loadgen.py reads it, before [DONE]. /metrics:
``fake_server_name{name="..."} 1`` and ``fake_completions_total``. `--exit-on PATH`: the process exits with 3 once PATH
exists.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from eaglenest.foundation.http.instance_auth import InstanceGuard


def app_for(name: str) -> FastAPI:
    app = FastAPI()
    served = [0]  # completions answered

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("")

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(f'fake_server_name{{name="{name}"}} 1\n'
                                 f"fake_completions_total {served[0]}\n")

    @app.post("/v1/completions")
    async def completions(request: Request):  # type: ignore[no-untyped-def]
        body = await request.json()
        served[0] += 1
        await asyncio.sleep(float(body.get("delay", 0)))
        if body.get("stream"):
            asked = int(body.get("max_tokens") or 3)
            tokens = min(3, max(1, asked))
            end = "length" if tokens == asked else "stop"
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            created, rid = int(time.time()), served[0]

            def chunk(**fields):  # type: ignore[no-untyped-def]
                return {"server": name, "id": f"cmpl-fake-{rid}",
                        "object": "text_completion", "created": created,
                        "model": body.get("model", name), **fields}

            async def events():  # type: ignore[no-untyped-def]
                for i in range(tokens):
                    last = i == tokens - 1
                    yield "data: " + json.dumps(chunk(i=i, choices=[{
                        "index": 0, "text": f" t{i}", "logprobs": None,
                        "finish_reason": end if last else None}])) + "\n\n"
                    await asyncio.sleep(0.1)
                if usage:
                    prompt = len(str(body.get("prompt", "")).split())
                    yield "data: " + json.dumps(chunk(choices=[], usage={
                        "prompt_tokens": prompt, "completion_tokens": tokens,
                        "total_tokens": prompt + tokens})) + "\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")
        return JSONResponse({"server": name, "body": body})

    return app


def _exit_on(path: Path) -> None:
    while not path.exists():
        time.sleep(0.1)
    os._exit(3)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--exit-on", default=None)
    args = p.parse_args()
    if args.exit_on is not None:
        threading.Thread(target=_exit_on, args=(Path(args.exit_on),), daemon=True).start()
    uvicorn.run(InstanceGuard(app_for(args.name)), host="127.0.0.1", port=args.port,
                log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
