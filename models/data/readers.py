"""JSONL readers: ShareGPT, OpenAI chat and OpenAI completions, detected line by line.

* ShareGPT: ``{"conversations": [{"from": "human"|"gpt"|"system", "value": "..."}]}``
* OpenAI chat: ``{"messages": [{"role": "user"|"assistant"|"system", "content": "..."}]}``
  (content may also be a list of ``{"type": "text", "text": ...}`` parts)
* OpenAI completions: ``{"prompt": "...", "completion": "..."}``

Every error names the file and the 1-based line number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}
CHAT_ROLES = {"system", "user", "assistant", "developer", "tool"}


class DataError(ValueError):
    """Bad training data; the message names the file and line."""


@dataclass
class Chat:
    messages: list[dict[str, str]]  # [{"role": ..., "content": ...}], roles normalised


@dataclass
class Completion:
    prompt: str
    completion: str


Example = Chat | Completion


def parse_record(record: Any) -> Example:
    """One JSON object -> Chat or Completion; ValueError (without location) if unusable."""
    if not isinstance(record, dict):
        raise ValueError("each line must be a JSON object")
    if "conversations" in record:
        return Chat(_sharegpt(record["conversations"]))
    if "messages" in record:
        return Chat(_openai_chat(record["messages"]))
    if "prompt" in record and "completion" in record:
        prompt, completion = record["prompt"], record["completion"]
        if not isinstance(prompt, str) or not isinstance(completion, str):
            raise ValueError("'prompt' and 'completion' must be strings")
        if not completion:
            raise ValueError("empty 'completion'")
        return Completion(prompt, completion)
    raise ValueError(
        "unknown format: expected 'conversations' (ShareGPT), 'messages' (OpenAI chat) "
        "or 'prompt'+'completion' (OpenAI completions)"
    )


def _sharegpt(turns: Any) -> list[dict[str, str]]:
    if not isinstance(turns, list):
        raise ValueError("'conversations' must be a list")
    out = []
    for n, turn in enumerate(turns):
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            raise ValueError(f"conversations[{n}] needs 'from' and 'value'")
        role = SHAREGPT_ROLES.get(str(turn["from"]).lower())
        if role is None:
            raise ValueError(f"conversations[{n}]: unknown speaker {turn['from']!r}")
        out.append({"role": role, "content": _text(turn["value"], f"conversations[{n}]")})
    return _check_chat(out)


def _openai_chat(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list):
        raise ValueError("'messages' must be a list")
    out = []
    for n, msg in enumerate(messages):
        if not isinstance(msg, dict) or "role" not in msg:
            raise ValueError(f"messages[{n}] needs 'role' and 'content'")
        role = str(msg["role"])
        if role not in CHAT_ROLES:
            raise ValueError(f"messages[{n}]: unknown role {role!r}")
        role = "system" if role == "developer" else role
        out.append({"role": role, "content": _text(msg.get("content"), f"messages[{n}]")})
    return _check_chat(out)


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        ]
        return "".join(parts)
    raise ValueError(f"{where}: content must be a string or a list of text parts")


def _check_chat(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    if not any(m["role"] == "assistant" and m["content"] for m in messages):
        raise ValueError("no assistant turn with content (nothing to train on)")
    return messages


def read_jsonl(path: str | Path) -> list[Example]:
    """All examples of one JSONL file; DataError naming file:line on the first bad line."""
    path = Path(path)
    examples: list[Example] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg})") from e
            try:
                examples.append(parse_record(record))
            except ValueError as e:
                raise DataError(f"{path}:{lineno}: {e}") from e
    if not examples:
        raise DataError(f"{path}: no usable sample (empty file)")
    return examples


def data_files(source: str | Path) -> list[Path]:
    """A file, or every *.jsonl under a directory (sorted), or a built-in dataset name."""
    from eaglenest.models.data.builtin import builtin_path, is_builtin

    if is_builtin(str(source)):
        return [builtin_path(str(source))]
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
        if not files:
            raise DataError(f"{path}: directory holds no .jsonl files")
        return files
    if not path.is_file():
        raise DataError(f"{path}: no such data file or built-in dataset")
    return [path]


def load_examples(source: str | Path) -> list[Example]:
    examples: list[Example] = []
    for f in data_files(source):
        examples.extend(read_jsonl(f))
    return examples
