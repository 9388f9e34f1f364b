"""Turn examples into token ids with the target's chat template and an assistant-only mask."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eaglenest.models.data.readers import Chat, Completion, DataError, Example


@dataclass
class Sample:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token belongs to an assistant turn / completion


def assistant_spans(
    messages: list[dict[str, str]], tokenizer: Any
) -> tuple[str, list[tuple[int, int]]]:
    """Render the chat; return (text, character spans of each assistant turn).

    A span runs from the end of the rendered prefix with the generation prompt to the end of
    the rendered conversation including that turn, so it covers the turn's end-of-turn
    marker too (the head should learn to draft it).
    Example (ChatML): "<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n" is the
    prefix; the span is "hello<|im_end|>\\n".
    """

    def render(msgs: list[dict[str, str]], gen: bool) -> str:
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    text = render(messages, False)
    spans = []
    cursor = 0
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        prefix, upto = render(messages[:i], True), render(messages[: i + 1], False)
        if upto.startswith(prefix) and text.startswith(upto):
            spans.append((len(prefix), len(upto)))
        else:  # template not prefix-stable: fall back to locating the content itself
            start = text.find(msg["content"], cursor)
            if start < 0:
                raise ValueError("chat template dropped an assistant turn")
            spans.append((start, start + len(msg["content"])))
        cursor = spans[-1][1]
    return text, spans


def _tokens_in_spans(
    text: str, spans: list[tuple[int, int]], tokenizer: Any
) -> tuple[list[int], list[int]]:
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    mask = [int(any(s <= a < e for s, e in spans)) for a, _ in offsets]
    return list(ids), mask


def encode_example(example: Example, tokenizer: Any, max_length: int = 2048) -> Sample:
    if isinstance(example, Chat):
        text, spans = assistant_spans(example.messages, tokenizer)
        ids, mask = _tokens_in_spans(text, spans, tokenizer)
    elif isinstance(example, Completion):
        text = example.prompt + example.completion
        ids, mask = _tokens_in_spans(text, [(len(example.prompt), len(text))], tokenizer)
        if tokenizer.eos_token_id is not None:
            ids, mask = ids + [tokenizer.eos_token_id], mask + [1]
    else:  # pragma: no cover - type guard
        raise TypeError(type(example))
    return Sample(ids[:max_length], mask[:max_length])


def encode_examples(
    examples: list[Example], tokenizer: Any, max_length: int = 2048, min_loss_tokens: int = 2
) -> list[Sample]:
    """Encode all; drop samples with fewer than ``min_loss_tokens`` trainable tokens."""
    if not getattr(tokenizer, "is_fast", False):
        raise DataError("a fast tokenizer (tokenizer.json) is required for loss masks")
    samples = [encode_example(e, tokenizer, max_length) for e in examples]
    kept = [s for s in samples if sum(s.loss_mask) >= min_loss_tokens]
    if not kept:
        raise DataError("no usable sample: every sample lost its assistant tokens")
    return kept
