"""Oracle draft sources: drafts read from a known token sequence (usually the target's own
greedy continuation), with optional deliberate mistakes, to exercise full acceptance,
partial acceptance, sibling acceptance in trees and the bonus token."""

from __future__ import annotations

from collections.abc import Callable

import torch

from eaglenest.models.decode.drafter import HeadDrafter
from eaglenest.models.decode.runner import StepOutput
from eaglenest.models.decode.sampling import SamplingParams


class OracleDrafter(HeadDrafter):
    """Head-free drafter. Slot/position p predicts seq[p + 2] (the head slot convention).

    ``rank(idx)`` says where the true token seq[idx] sits among the logits: 0 = top (the
    draft is right), 1 = second (a tree with topk >= 2 still has it as a sibling), 99 =
    nowhere near the top. Other logits are fixed noise seeded by idx.
    """

    def __init__(
        self,
        seq: list[int],
        vocab: int,
        rank: Callable[[int], int] = lambda idx: 0,
        gap: float = 3.0,
    ) -> None:
        self.seq, self.rank, self.gap = list(seq), rank, gap
        self.head = None  # type: ignore[assignment]
        self.uses_aux, self.parallel = False, True
        self.vocab_size = vocab
        self.target_ids = torch.arange(vocab)
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.reset()

    def features(self, out: StepOutput, rows: list[int] | slice) -> torch.Tensor:
        return out.last_hidden[rows]

    def logits_at(self, pos: int) -> torch.Tensor:
        idx = pos + 2
        g = torch.Generator().manual_seed(1000 + idx)
        logits = torch.randn(self.vocab_size, generator=g)
        if idx < len(self.seq):
            tok = self.seq[idx]
            r = self.rank(idx)
            order = logits.argsort(descending=True).tolist()
            order.remove(tok)
            order.insert(min(r, len(order)), tok)
            ranks = torch.empty(self.vocab_size)
            ranks[torch.tensor(order)] = torch.arange(self.vocab_size, dtype=torch.float)
            logits = -ranks * self.gap  # a strict ranking: ``order``
        return logits

    def extend(self, tokens: list[int], feats: torch.Tensor) -> None:
        self.slots += len(tokens)
        self.last_logits = self.logits_at(self.slots - 1)
        self.last_out = torch.zeros(1, 1, 1)

    def crop(self) -> None:
        pass

    def step(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.stack([self.logits_at(int(p)) for p in positions.view(-1)])
        return rows, torch.zeros(1, rows.shape[0], 1)

    def draft_parallel(
        self, k: int, params: SamplingParams, gen: torch.Generator | None
    ) -> tuple[list[int], torch.Tensor | None]:
        picks = [self.pick(self.logits_at(self.slots - 1 + j), params, gen) for j in range(k)]
        drafts = [t for t, _ in picks]
        return drafts, None if params.greedy else torch.stack([q for _, q in picks])  # type: ignore[misc]

    def draft_block(
        self, k: int, params: SamplingParams, gen: torch.Generator | None
    ) -> tuple[list[int], torch.Tensor | None]:
        """Block mode: the same k drafts (slot j of the block after the committed context
        proposes seq[slots + j], as the parallel layout's)."""
        return self.draft_parallel(k, params, gen)
