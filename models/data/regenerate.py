"""Regenerate assistant turns with the target itself (what EAGLE-3 and SageMaker do).

Training on the target's own outputs teaches the head the distribution it will be asked to
predict at serve time. Greedy by default (temperature 0); sampled with a seeded generator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from eaglenest.models.data.readers import Chat, Completion, Example
from eaglenest.models.target import Target

#: bump when a change here makes `regenerate` write different answers for the same target,
#: examples and arguments: optimization jobs' regeneration cache keys include it
#: (workers/jobs/regen_cache.py), so answers cached before the change are not reused
VERSION = 1


def _generate_batch(
    target: Target, prompts: list[list[int]], max_new_tokens: int, temperature: float
) -> list[str]:
    """One `generate` call for several prompts, left-padded so every row ends at the same
    column and the new tokens start together.

    Worked example, pad id 0, prompts [5, 6, 7] and [8]:
        input_ids      [[5, 6, 7], [0, 0, 8]]
        attention_mask [[1, 1, 1], [0, 0, 1]]
    transformers derives position ids from the mask (cumsum - 1), so row 2's token 8 sits
    at position 0 as it would alone; the continuation of every row is `out[:, 3:]`.
    """
    device = next(target.model.parameters()).device
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(len(ids) for ids in prompts)
    x = torch.full((len(prompts), width), pad, dtype=torch.long)  # [batch, width]
    mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [batch, width]
    for row, ids in enumerate(prompts):
        x[row, width - len(ids) :] = torch.tensor(ids)
        mask[row, width - len(ids) :] = 1
    kwargs: dict = {"do_sample": temperature > 0, "max_new_tokens": max_new_tokens}
    if temperature > 0:
        kwargs["temperature"] = temperature
    with torch.no_grad():
        out = target.model.generate(
            x.to(device), attention_mask=mask.to(device), pad_token_id=pad, **kwargs
        )
    return [tok.decode(row[width:], skip_special_tokens=True) for row in out]


class _Pending:
    """One example being rewritten: the turns kept so far and the ones still to go."""

    def __init__(self, example: Example, tok: Any) -> None:
        self.example = example
        if isinstance(example, Completion):
            self.done: list[dict[str, str]] = []
            self.todo: list[dict[str, str]] = [{"role": "assistant", "content": ""}]
            self.prompt_ids = list(tok(example.prompt, add_special_tokens=False)["input_ids"])
        else:
            self.done, self.todo = [], [dict(m) for m in example.messages]
        self.tok = tok
        self._advance()

    def _advance(self) -> None:
        while self.todo and self.todo[0]["role"] != "assistant":
            self.done.append(self.todo.pop(0))

    def next_prompt(self) -> list[int] | None:
        if not self.todo:
            return None
        if isinstance(self.example, Completion):
            return self.prompt_ids
        return list(self.tok.apply_chat_template(
            self.done, tokenize=True, add_generation_prompt=True, return_dict=False))

    def answer(self, text: str) -> None:
        self.todo.pop(0)
        self.done.append({"role": "assistant", "content": text})
        self._advance()

    def result(self) -> Example:
        if isinstance(self.example, Completion):
            return Completion(self.example.prompt, self.done[-1]["content"])
        return Chat(self.done)


def regenerate_example(
    example: Example, target: Target, max_new_tokens: int = 256, temperature: float = 0.0
) -> Example:
    return regenerate([example], target, max_new_tokens, temperature, keep_empty=True)[0]


def regenerate(
    examples: list[Example],
    target: Target,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    seed: int = 0,
    batch_size: int = 8,
    keep_empty: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> list[Example]:
    """Every assistant turn / completion replaced by the target's own continuation.

    Turn t of every example is generated before turn t + 1 (it conditions on the rewritten
    turn t), `batch_size` prompts per `generate` call, similar lengths together so little
    compute goes to padding. Greedy output does not depend on the batching beyond float
    rounding in the padded matmuls. `progress(done, total)` is called after every batch
    (turns written so far, turns in all); it may raise to abandon the work.
    """
    torch.manual_seed(seed)
    pending = [_Pending(e, target.tokenizer) for e in examples]
    total = sum(1 for p in pending for m in p.todo if m["role"] == "assistant")
    done = 0
    while True:
        ready = [(p, ids) for p in pending if (ids := p.next_prompt()) is not None]
        if not ready:
            break
        ready.sort(key=lambda item: len(item[1]))
        for i in range(0, len(ready), batch_size):
            chunk = ready[i : i + batch_size]
            texts = _generate_batch(target, [ids for _, ids in chunk], max_new_tokens,
                                    temperature)
            for (p, _), text in zip(chunk, texts, strict=True):
                p.answer(text)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    out = [p.result() for p in pending]
    return out if keep_empty else [e for e in out if answered(e)]


def answered(example: Example) -> bool:
    """False for a chat whose assistant turns all came back empty (nothing to train on)."""
    return not isinstance(example, Chat) or any(
        m["role"] == "assistant" and m["content"] for m in example.messages)
