"""Regenerate assistant turns with the target itself (what EAGLE-3 and SageMaker do).

Training on the target's own outputs teaches the head the distribution it will be asked to
predict at serve time. Greedy by default (temperature 0); sampled with a seeded generator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from eaglenest.models.data.readers import Chat, Completion, Example
from eaglenest.models.decode.batch import BatchEngine
from eaglenest.models.decode.kernels import KernelPolicy
from eaglenest.models.target import Target

#: bump when a change here makes `regenerate` write different answers for the same target,
#: examples and arguments: optimization jobs' regeneration cache keys include it
#: (workers/jobs/regen_cache.py), so answers cached before the change are not reused
VERSION = 2


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
    batch_size: int = 32,
    keep_empty: bool = False,
    progress: Callable[[int, int], None] | None = None,
    max_batch_tokens: int = 32_768,
    continuous: bool = True,
) -> list[Example]:
    """Every assistant turn / completion replaced by the target's own continuation.

    Turn t of an example is generated after its turn t - 1 (it conditions on the rewritten
    turn). Decoding is continuous batching (models/decode/batch.py): up to `batch_size`
    turns decode together, each one's prompt plus `max_new_tokens` counted against
    `max_batch_tokens` (the KV cache's bound; one turn always runs), and a finished turn's
    row goes at once to the next turn waiting, where `generate` would decode every batch to
    its longest answer. `continuous=False`, and targets the batch engine cannot run
    (recurrent layers), decode left-padded `generate` batches of `batch_size` instead.
    Greedy output does not depend on the batching beyond float rounding; turn j of example
    i samples with seed `seed + 1000 * i + j` whatever the order. `progress(done, total)`
    is called as turns finish (turns written so far, turns in all); it may raise to
    abandon the work.
    """
    torch.manual_seed(seed)
    pending = [_Pending(e, target.tokenizer) for e in examples]
    total = sum(1 for p in pending for m in p.todo if m["role"] == "assistant")
    batch = _Batching(target, max_new_tokens, temperature, seed, batch_size, max_batch_tokens)
    batch.run(pending, total, progress, continuous)
    out = [p.result() for p in pending]
    return out if keep_empty else [e for e in out if answered(e)]


#: decodes one round of turns, each (example index, turn index, prompt ids), to their texts
Generate = Callable[[list[tuple[int, int, list[int]]]], list[str]]


def regenerate_by(
    examples: list[Example],
    tokenizer: Any,
    generate: Generate,
    keep_empty: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> list[Example]:
    """``regenerate`` with another engine's decoding (a vLLM engine:
    workers/jobs/vllm_regenerate.py): round r hands ``generate`` turn r of every example
    that has one, all at once (turn r conditions on the rewritten turns before it). The
    turn index is the number of messages before the turn, as ``regenerate`` seeds by.
    ``progress(done, total)`` after each round."""
    pending = [_Pending(e, tokenizer) for e in examples]
    total = sum(1 for p in pending for m in p.todo if m["role"] == "assistant")
    done = 0
    while True:
        ready = [(i, p, ids) for i, p in enumerate(pending)
                 if (ids := p.next_prompt()) is not None]
        if not ready:
            break
        texts = generate([(i, len(p.done), ids) for i, p, ids in ready])
        for (_, p, _), text in zip(ready, texts, strict=True):
            p.answer(text)
        done += len(ready)
        if progress is not None:
            progress(done, total)
    out = [p.result() for p in pending]
    return out if keep_empty else [e for e in out if answered(e)]


class _Batching:
    """One `regenerate` call's decoding: the batch engine's step loop, else `generate`."""

    def __init__(self, target: Target, max_new_tokens: int, temperature: float, seed: int,
                 batch_size: int, max_batch_tokens: int) -> None:
        self.target, self.max_new, self.temperature = target, max_new_tokens, temperature
        self.seed, self.rows, self.budget = seed, max(1, batch_size), max_batch_tokens
        self.done = 0

    def run(self, pending: list[_Pending], total: int,
            progress: Callable[[int, int], None] | None, continuous: bool) -> None:
        if not continuous:
            self._run_generate(pending, total, progress)
            return
        try:
            engine = BatchEngine(self.target.model, None, max_num_seqs=self.rows,
                                 kernels=KernelPolicy(force="stock"))
        except ValueError:  # recurrent layers: no batched KV cache
            self._run_generate(pending, total, progress)
            return
        self._run_engine(engine, pending, total, progress)

    def _run_engine(self, engine: BatchEngine, pending: list[_Pending], total: int,
                    progress: Callable[[int, int], None] | None) -> None:
        tok = self.target.tokenizer
        stop = _stop_ids(self.target)
        ready = [(i, p) for i, p in enumerate(pending) if p.todo]
        ready.reverse()  # pop() takes the first example first
        running: dict[int, tuple[int, _Pending, int, list[int]]] = {}
        used = 0
        while ready or running:
            while ready and len(running) < self.rows:
                i, p = ready[-1]
                ids = p.next_prompt()
                assert ids is not None
                cost = len(ids) + self.max_new
                if running and used + cost > self.budget:
                    break
                ready.pop()
                turn = len(p.done)
                rid = engine.submit(ids, self.max_new, temperature=self.temperature,
                                    stop_token_ids=stop, seed=self.seed + 1000 * i + turn)
                running[rid], used = (i, p, cost, []), used + cost
            for rid, new, finished in engine.step():
                running[rid][3].extend(new)
                if not finished:
                    continue
                i, p, cost, ids = running.pop(rid)
                used -= cost
                p.answer(tok.decode([t for t in ids if t not in stop],
                                    skip_special_tokens=True))
                if p.todo:
                    ready.append((i, p))
                self.done += 1
                if progress is not None:
                    progress(self.done, total)

    def _run_generate(self, pending: list[_Pending], total: int,
                      progress: Callable[[int, int], None] | None) -> None:
        while True:
            ready = [(p, ids) for p in pending if (ids := p.next_prompt()) is not None]
            if not ready:
                break
            ready.sort(key=lambda item: len(item[1]))
            for i in range(0, len(ready), self.rows):
                chunk = ready[i : i + self.rows]
                texts = _generate_batch(self.target, [ids for _, ids in chunk], self.max_new,
                                        self.temperature)
                for (p, _), text in zip(chunk, texts, strict=True):
                    p.answer(text)
                self.done += len(chunk)
                if progress is not None:
                    progress(self.done, total)


def _stop_ids(target: Target) -> list[int]:
    """The ids that end a turn: the generation config's eos ids, else the tokenizer's."""
    eos = getattr(getattr(target.model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = target.tokenizer.eos_token_id
    ids = eos if isinstance(eos, list) else [eos]
    return [int(i) for i in ids if i is not None]


def answered(example: Example) -> bool:
    """False for a chat whose assistant turns all came back empty (nothing to train on)."""
    return not isinstance(example, Chat) or any(
        m["role"] == "assistant" and m["content"] for m in example.messages)
