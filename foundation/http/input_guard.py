"""MAX_INPUT_LENGTH for a vLLM server: ASGI middleware that vLLM loads in its own process
(``--middleware eaglenest.foundation.http.input_guard.InputLengthGuard``), since vLLM itself
bounds only prompt + output (--max-model-len).

Contract:
- Listed before InstanceGuard on vLLM's command line: Starlette runs the last middleware
  added outermost, so a request is authenticated before it is tokenized.
- Active only when its environment has ``EAGLENEST_MAX_INPUT_LENGTH`` (the container's
  MAX_INPUT_LENGTH, set by workers/model_servers/process.py) and ``EAGLENEST_TOKENIZER_DIR`` (the
  model folder); otherwise every request passes untouched.
- ``POST /v1/completions``: the prompt's tokens (a string is tokenized without special
  tokens, as vLLM's completions endpoint adds them only where the tokenizer does; a list of
  ids counts as is; a list of prompts: the longest); ``POST /v1/chat/completions``: the
  messages through the model's chat template with the generation prompt, tokenized. More
  than the bound: a 400 in vLLM's error shape whose message names MAX_INPUT_LENGTH, and
  the request never reaches vLLM. A body it cannot read passes on (vLLM answers it).
- The body is read whole (the runtime bounds it before it gets here) and replayed to vLLM.
- The tokenizer (transformers, already loaded in a vLLM process) loads on first use.
"""

from __future__ import annotations

import json
import os
from typing import Any

from eaglenest.foundation.http.asgi import reply

LIMIT_ENV, TOKENIZER_ENV = "EAGLENEST_MAX_INPUT_LENGTH", "EAGLENEST_TOKENIZER_DIR"
_PATHS = ("/v1/completions", "/v1/chat/completions")


def prompt_tokens(body: dict[str, Any], tokenizer: Any, chat: bool) -> int | None:
    """The request's prompt tokens (module contract); None when the body has no prompt."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers 5: a
        # BatchEncoding; earlier: the list of ids
    prompt = body.get("prompt")
    prompts = prompt if isinstance(prompt, list) and prompt and not isinstance(
        prompt[0], int) else [prompt]
    counts = []
    for p in prompts:
        if isinstance(p, str):
            counts.append(len(tokenizer(p, add_special_tokens=True)["input_ids"]))
        elif isinstance(p, list):
            counts.append(len(p))
    return max(counts) if counts else None


class InputLengthGuard:
    """ASGI middleware (module contract)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        raw = os.environ.get(LIMIT_ENV, "")
        self.limit = int(raw) if raw.isdigit() else None
        self.folder = os.environ.get(TOKENIZER_ENV, "")
        self._tokenizer: Any = None

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.folder)
        return self._tokenizer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (self.limit is None or not self.folder or scope["type"] != "http"
                or scope.get("method") != "POST" or scope.get("path") not in _PATHS):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        count = self._count(body, scope["path"] == _PATHS[1])
        if count is not None and count > self.limit:
            text = (f"The prompt contains {count} input tokens, more than MAX_INPUT_LENGTH="
                    f"{self.limit} allows. Please reduce the length of the input prompt.")
            await reply(send, 400, json.dumps({
                "error": {"message": text, "type": "BadRequestError", "param": "input_tokens",
                          "code": 400}}).encode(), b"application/json")
            return
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _count(self, body: bytes, chat: bool) -> int | None:
        try:
            parsed = json.loads(body)
        except ValueError:
            return None
        if not isinstance(parsed, dict):
            return None
        try:
            return prompt_tokens(parsed, self.tokenizer(), chat)
        except Exception:  # noqa: BLE001 - a template or prompt vLLM will refuse in its words
            return None
