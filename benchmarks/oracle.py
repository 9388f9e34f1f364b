"""Oracle drafts: draft tokens read from a known continuation of the prompt (plain greedy
decoding's output), so every draft the target would emit is accepted and a chain of K
reaches the acceptance length tau = K + 1: the engine's speed ceiling for that K (the cost
of verifying K + 1 tokens per round with perfect drafts, no head work).

Shared by benchmarks/decode.py (``OracleSource``: one continuation per prompt) and the GPU
check (``oracle_factory``: one fixed sequence); needs only torch and our package.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from eaglenest.models.decode.drafter import HeadDrafter
from eaglenest.models.decode.runner import StepOutput
from eaglenest.models.decode.sampling import SamplingParams


class OracleDrafter(HeadDrafter):
    """Head-free drafter over ``seq`` (prompt + the greedy output): slot p drafts seq[p + 2]
    (the head slot convention, models/decode/drafter.py); past the end of ``seq`` it drafts
    ``end``, which the target need not accept. No head, no device work."""

    def __init__(self, seq: list[int], end: int) -> None:
        self.seq = list(seq)
        self.head = None  # type: ignore[assignment]
        self.uses_aux, self.parallel = False, True
        self.target_ids = torch.tensor([*self.seq, end])  # logit i -> seq[i]; last: the end
        self.vocab_size = len(self.seq) + 1
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.reset()

    def logits_at(self, slot: int) -> torch.Tensor:  # slot p drafts seq[p + 2]
        out = torch.zeros(self.vocab_size)
        out[min(slot + 2, len(self.seq))] = 1.0
        return out

    def features(self, out: StepOutput, rows: list[int] | slice) -> torch.Tensor:
        return out.last_hidden[rows]

    def extend(self, tokens: list[int], feats: torch.Tensor) -> None:
        self.slots += len(tokens)
        self.last_logits, self.last_out = self.logits_at(self.slots - 1), torch.zeros(1, 1, 1)

    def crop(self) -> None:
        pass

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.stack([self.logits_at(int(p)) for p in positions.view(-1)])
        return rows, torch.zeros(1, rows.shape[0], 1)

    def draft_parallel(self, k: int, params: SamplingParams,
                       gen: torch.Generator | None) -> tuple[list[int], None]:
        seq = self.seq
        return [seq[min(self.slots + 1 + j, len(seq) - 1)] for j in range(k)], None


def oracle_factory(seq: list[int], end: int) -> Callable[[], HeadDrafter]:
    """A SpeculativeEngine ``drafter_factory`` whose drafts are read from ``seq`` (prompt +
    the greedy output): full acceptance wherever ``seq`` is what the target emits."""
    return lambda: OracleDrafter(seq, end)


class OracleSource:
    """The oracle of the prompt last loaded, for engines decoding one prompt after another:
    ``load(prompt + plain output)`` before each prompt (untimed, by the caller), then
    ``drafter`` (an engine's ``drafter_factory``) drafts from it for that prompt's request."""

    def __init__(self, end: int) -> None:
        self.end = end
        self.seq: list[int] = []

    def load(self, seq: list[int]) -> None:
        self.seq = list(seq)

    def drafter(self) -> HeadDrafter:
        return OracleDrafter(self.seq, self.end)
