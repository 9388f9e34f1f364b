"""Regenerate assistant turns with the target itself (what EAGLE-3 and SageMaker do).

Training on the target's own outputs teaches the head the distribution it will be asked to
predict at serve time. Greedy by default (temperature 0); sampled with a seeded generator.
"""

from __future__ import annotations

import torch

from models.data.readers import Chat, Completion, Example
from models.target import Target


def _generate(target: Target, ids: list[int], max_new_tokens: int, temperature: float) -> str:
    device = next(target.model.parameters()).device
    x = torch.tensor([ids], device=device)
    kwargs: dict = {"do_sample": temperature > 0, "max_new_tokens": max_new_tokens}
    if temperature > 0:
        kwargs["temperature"] = temperature
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    with torch.no_grad():
        out = target.model.generate(
            x, attention_mask=torch.ones_like(x), pad_token_id=pad, **kwargs
        )
    return tok.decode(out[0, len(ids) :], skip_special_tokens=True)


def regenerate_example(
    example: Example, target: Target, max_new_tokens: int = 256, temperature: float = 0.0
) -> Example:
    tok = target.tokenizer
    if isinstance(example, Completion):
        ids = tok(example.prompt, add_special_tokens=False)["input_ids"]
        return Completion(example.prompt, _generate(target, ids, max_new_tokens, temperature))
    messages: list[dict[str, str]] = []
    for msg in example.messages:
        if msg["role"] != "assistant":
            messages.append(dict(msg))
            continue
        ids = tok.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        text = _generate(target, list(ids), max_new_tokens, temperature)
        messages.append({"role": "assistant", "content": text})
    return Chat(messages)


def regenerate(
    examples: list[Example],
    target: Target,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[Example]:
    """Every assistant turn / completion replaced by the target's own continuation."""
    torch.manual_seed(seed)
    out = []
    for e in examples:
        new = regenerate_example(e, target, max_new_tokens, temperature)
        if isinstance(new, Chat) and not any(
            m["role"] == "assistant" and m["content"] for m in new.messages
        ):
            continue  # the target answered with nothing usable
        out.append(new)
    return out
