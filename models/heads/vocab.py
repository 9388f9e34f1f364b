"""Reduced draft vocabulary for EAGLE-3 / P-EAGLE / DFlash heads, chosen by token frequency,
and ``DraftVocabHead``, the base class of the heads that have one."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from eaglenest.models.data.template import Sample
    from eaglenest.models.target import Capture, Target


def token_counts(sequences: Iterable[list[int]], vocab_size: int) -> torch.Tensor:
    """[vocab] long: how often each target token id occurs."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        if seq:
            counts += torch.bincount(torch.tensor(seq, dtype=torch.long), minlength=vocab_size)
    return counts


def build_draft_vocab(
    counts: torch.Tensor, draft_vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the ``draft_vocab_size`` most frequent ids; return (d2t, t2d).

    Draft ids enumerate the chosen target ids in ascending order, so
    ``target_id = draft_id + d2t[draft_id]`` (vLLM's convention) and ``t2d`` is a bool mask
    over the target vocabulary. Ties (and ids never seen) go to the lower id, so the choice is
    deterministic.

    Example: counts = [5, 0, 9, 1, 7], draft_vocab_size = 3 -> chosen target ids {0, 2, 4}
      d2t = [0 - 0, 2 - 1, 4 - 2] = [0, 1, 2]
      t2d = [True, False, True, False, True]
    """
    vocab = counts.shape[0]
    if not 0 < draft_vocab_size <= vocab:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} must be in 1..{vocab}")
    # stable sort by descending count keeps lower ids first among equal counts
    order = torch.sort(counts, descending=True, stable=True).indices
    chosen = torch.sort(order[:draft_vocab_size]).values  # [draft_vocab] ascending target ids
    d2t = chosen - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[chosen] = True
    return d2t, t2d


def draft_to_target(draft_ids: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """Map draft ids (any shape) to target ids: id + d2t[id]."""
    return draft_ids + d2t[draft_ids]


def draft_vocab_for(
    target: Target, samples: list[Sample], size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) of the ``size`` (at most the target's vocabulary) most frequent ids among
    the samples' trained (assistant) tokens."""
    seqs = ([t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m] for s in samples)
    return build_draft_vocab(token_counts(seqs, target.vocab_size), min(size, target.vocab_size))


class DraftVocabHead(nn.Module):
    """A head over a draft vocabulary: its lm_head rows are target ids ``d + d2t[d]``.

    Subclasses register the buffers ``d2t`` [draft_vocab] / ``t2d`` [vocab] (from
    ``build_draft_vocab``) and set ``embed_tokens`` (the target's, frozen) and ``lm_head``.
    """

    d2t: torch.Tensor
    t2d: torch.Tensor
    embed_tokens: nn.Embedding
    lm_head: nn.Linear

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_to_target(draft_ids, self.d2t)

    def target_id_order(self) -> torch.Tensor:
        """[draft_vocab] target ids in draft-id order (draft id d <-> target id d + d2t[d])."""
        return self.to_target_ids(torch.arange(self.d2t.shape[0], device=self.d2t.device))

    def init_from_target(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        """Copy the frozen embeddings; start lm_head from the target's rows for the draft vocab."""
        with torch.no_grad():
            self.embed_tokens.weight.copy_(embed_weight)
            self.lm_head.weight.copy_(lm_head_weight[self.target_id_order()])

    def target_distribution(self, cap: Capture) -> tuple[torch.Tensor, torch.Tensor]:
        """Target capture -> (probs over the draft vocab [batch, seq, draft_vocab], in vocab).

        Position p's row is the target's distribution of x[p+1]. The second tensor [batch,
        seq] marks positions whose target argmax is a draft-vocab token: only there can a
        greedy draft be accepted, so only there is the loss scored.
        """
        restricted = cap.logits_for(self.target_id_order())  # [batch, seq, draft_vocab]
        in_vocab = self.t2d[cap.target_argmax()]
        return F.softmax(restricted.float(), dim=-1), in_vocab
