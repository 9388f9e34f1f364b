"""InvokeEndpoint bodies -> OpenAI requests, and replies back: the request side of our
model container (what an LMI container's front end does before its engine).

The container reads, whatever the caller's Accept:
- LMI JSON: `{"inputs": "text", "parameters": {"max_new_tokens", "temperature", "top_p",
  "stop", "do_sample", "seed"}}` -> `/v1/completions`; reply `{"generated_text": ...}`
  (streaming: JSON lines `{"token": {"text": ...}}`, then one with `generated_text`).
- OpenAI JSON: a body with `messages` (-> `/v1/chat/completions`) or `prompt`
  (-> `/v1/completions`), passed through unchanged, replies unchanged.
- `text/plain`: the body is the prompt, answered as LMI.
SageMaker itself never judges a body: one this container does not understand is the
container's answer, 400 (or 415 for a content type it does not read), which the caller
gets as ModelError (see `ContainerRejected`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from eaglenest.foundation.errors import ServiceError

LMI, OPENAI = "lmi", "openai"
#: content types read as JSON (a missing one too: botocore sends none unless told)
JSON_TYPES = ("", "application/json", "application/octet-stream", "application/jsonlines")


class RuntimeValidationError(ServiceError):
    code = "ValidationError"


class ContainerRejected(Exception):
    """The container's own 4xx for a body it does not understand: `status`, and the JSON
    error body it answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = json.dumps({"code": status, "type": "BadRequest" if status == 400
                                else "UnsupportedMediaType", "message": message})


@dataclass
class Translated:
    path: str
    body: dict[str, Any]
    style: str


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _decode(raw: bytes, content_type: str | None) -> dict[str, Any]:
    media = _media_type(content_type)
    if media == "text/plain":
        try:
            return {"inputs": raw.decode("utf-8")}
        except UnicodeDecodeError:
            raise ContainerRejected(400, "text/plain body is not UTF-8 text.") from None
    if media not in JSON_TYPES and not media.endswith("+json"):
        raise ContainerRejected(415, f"Content type {media} is not supported: send "
                                     "application/json (LMI or OpenAI) or text/plain.")
    try:
        body = json.loads(raw or b"null")
    except (ValueError, RecursionError):
        raise ContainerRejected(400, "Request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise ContainerRejected(400, "Request body must be a JSON object.")
    return body


def translate(raw: bytes, served_name: str, stream: bool,
              content_type: str | None = "application/json") -> Translated:
    """The model server request for an InvokeEndpoint body; ContainerRejected if the
    container does not understand it."""
    body = _decode(raw, content_type)
    if "messages" in body or "prompt" in body:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        out = {**body, "model": served_name}
        if stream:
            out["stream"] = True
        return Translated(path, out, OPENAI)
    if "inputs" in body:
        return Translated("/v1/completions", _lmi(body, served_name, stream), LMI)
    raise ContainerRejected(
        400, "Request body must be LMI style ({\"inputs\": ..., \"parameters\": {...}}) or "
             "OpenAI style (with \"messages\" or \"prompt\")."
    )


def _lmi(body: dict[str, Any], served_name: str, stream: bool) -> dict[str, Any]:
    inputs, params = body["inputs"], body.get("parameters") or {}
    if not isinstance(inputs, str):
        raise ContainerRejected(400, "'inputs' must be a string.")
    if not isinstance(params, dict):
        raise ContainerRejected(400, "'parameters' must be an object.")
    out: dict[str, Any] = {"model": served_name, "prompt": inputs,
                           "max_tokens": params.get("max_new_tokens", 256)}
    do_sample = params.get("do_sample")
    temperature = params.get("temperature", 1.0 if do_sample else 0.0)
    out["temperature"] = 0.0 if do_sample is False else temperature
    for src, dst in (("top_p", "top_p"), ("stop", "stop"), ("seed", "seed")):
        if src in params:
            out[dst] = params[src]
    wanted = out["max_tokens"]
    if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
        raise ContainerRejected(400, "'parameters.max_new_tokens' must be a positive integer.")
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
