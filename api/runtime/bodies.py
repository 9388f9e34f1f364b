"""InvokeEndpoint bodies -> OpenAI requests, and replies back.

Two request styles are accepted, as SageMaker's LMI containers do:
- LMI: `{"inputs": "text", "parameters": {"max_new_tokens", "temperature", "top_p",
  "stop", "do_sample", "seed"}}` -> `/v1/completions`; reply `{"generated_text": ...}`
  (streaming: JSON lines `{"token": {"text": ...}}`, then one with `generated_text`).
- OpenAI: a body with `messages` (-> `/v1/chat/completions`) or `prompt`
  (-> `/v1/completions`), passed through unchanged, replies unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from eaglenest.foundation.errors import ServiceError

LMI, OPENAI = "lmi", "openai"


class RuntimeValidationError(ServiceError):
    code = "ValidationError"


@dataclass
class Translated:
    path: str
    body: dict[str, Any]
    style: str


def translate(raw: bytes, served_name: str, stream: bool) -> Translated:
    try:
        body = json.loads(raw or b"null")
    except ValueError:
        raise RuntimeValidationError("Request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise RuntimeValidationError("Request body must be a JSON object.")
    if "messages" in body or "prompt" in body:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        out = {**body, "model": served_name}
        if stream:
            out["stream"] = True
        return Translated(path, out, OPENAI)
    if "inputs" in body:
        return Translated("/v1/completions", _lmi(body, served_name, stream), LMI)
    raise RuntimeValidationError(
        "Request body must be LMI style ({\"inputs\": ..., \"parameters\": {...}}) or OpenAI "
        "style (with \"messages\" or \"prompt\")."
    )


def _lmi(body: dict[str, Any], served_name: str, stream: bool) -> dict[str, Any]:
    inputs, params = body["inputs"], body.get("parameters") or {}
    if not isinstance(inputs, str):
        raise RuntimeValidationError("'inputs' must be a string.")
    if not isinstance(params, dict):
        raise RuntimeValidationError("'parameters' must be an object.")
    out: dict[str, Any] = {"model": served_name, "prompt": inputs,
                           "max_tokens": params.get("max_new_tokens", 256)}
    do_sample = params.get("do_sample")
    temperature = params.get("temperature", 1.0 if do_sample else 0.0)
    out["temperature"] = 0.0 if do_sample is False else temperature
    for src, dst in (("top_p", "top_p"), ("stop", "stop"), ("seed", "seed")):
        if src in params:
            out[dst] = params[src]
    if not isinstance(out["max_tokens"], int) or out["max_tokens"] < 1:
        raise RuntimeValidationError("'parameters.max_new_tokens' must be a positive integer.")
    if stream:
        out["stream"] = True
    return out


def lmi_reply(openai_reply: dict[str, Any]) -> dict[str, Any]:
    return {"generated_text": openai_reply["choices"][0]["text"]}


def completion_text(reply: dict[str, Any]) -> str:
    choice = reply.get("choices", [{}])[0]
    return str(choice.get("text") or (choice.get("message") or {}).get("content") or "")


def chunk_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or [{}]
    c = choices[0] if choices else {}
    return str(c.get("text") or (c.get("delta") or {}).get("content") or "")


def capture_record(tr: Translated, text: str, endpoint: str, variant: str) -> dict[str, Any]:
    """One Data Capture line in OpenAI chat format, so it trains the next head directly."""
    if "messages" in tr.body:
        messages = list(tr.body["messages"])
    else:
        messages = [{"role": "user", "content": tr.body["prompt"]}]
    meta = {"endpoint": endpoint, "variant": variant, "style": tr.style}
    if tr.path == "/v1/completions":
        return {"prompt": tr.body["prompt"], "completion": text, "metadata": meta}
    return {"messages": [*messages, {"role": "assistant", "content": text}], "metadata": meta}
