"""Reduced draft vocabulary for EAGLE-3 / P-EAGLE heads, chosen by token frequency."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from eaglenest.models.data.template import Sample
    from eaglenest.models.target import Target


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
