"""DFlash training: random anchors, one block per anchor, a mask for those anchors only.

Per sequence ``anchors`` distinct positions a are drawn among those whose next token
x_{a+1} is trained (loss mask). Anchor a's block holds [x_a, MASK x (B-1)] at positions
a..a+B-1 and reads the context keys of positions 0..a-1 only -- what a decoder holds when
x_a is the target's newest token. Slot j >= 1 predicts x_{a+j}: its target is the target's
distribution at position a+j-1, scored where x_{a+j} is trained, inside the sequence and
drafted by the head's vocabulary (as EAGLE-3 scores). Slot j's loss is weighted
w_j = exp(-(j-1) / gamma) and the sum is normalised by sum_j w_j * count_j.

Variable prefix: each anchor draws p in [1, B-1]; slots 0..p-1 hold the real tokens
x_a..x_{a+p-1} and only slots >= p are scored.

Sequence partitioning (models/training/partition.py): part ``index`` of ``count`` runs the
anchors in ``Partition.bounds(A)`` (their blocks plus the whole context) and scores them
normalised as the whole step; every part draws the same anchors from ``Partition.seed``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from eaglenest.models.heads.base import HeadBatch, HeadLoss, Partition
from eaglenest.models.target import Capture

if TYPE_CHECKING:
    from eaglenest.models.heads.dflash import DFlashHead

__all__ = ["block_forward", "block_inputs", "block_loss", "block_mask", "pick_anchors",
           "slot_weights"]


def pick_anchors(
    eligible: torch.Tensor,  # [batch, seq] bool: positions that may anchor a block
    count: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(anchors [batch, A], ok [batch, A]) with A = min(count, seq): per row ``count``
    distinct random positions, eligible ones first, ascending; ``ok`` marks the eligible
    ones (a row with fewer eligible positions fills up with others, ok False).

    Example eligible [[0, 1, 1, 0, 1]]: count 2 -> two of {1, 2, 4}, e.g. [[1, 4]], ok
    [[1, 1]]; count 4 -> [[1, 2, x, 4]] for one x in {0, 3}, ok False there.
    """
    b, t = eligible.shape
    device = generator.device if generator is not None else eligible.device
    scores = torch.rand(b, t, generator=generator, device=device).to(eligible.device)
    scores = scores + eligible.float()  # eligible in [1, 2), others in [0, 1)
    picked = scores.topk(min(count, t), dim=1).indices.sort(dim=1).values  # [batch, A]
    return picked, eligible.gather(1, picked)


def block_mask(anchors: torch.Tensor, seq: int, block: int) -> torch.Tensor:
    """[batch, A*B, seq + A*B] bool over the selected anchors' blocks only (B = ``block``).

    Queries: block slots (anchor i, slot j) flattened as i*B + j. Keys: the ``seq`` context
    positions, then the A*B block slots in the same order. Query (i, j) sees context key p
    iff p < anchors[i], and every slot of its own block (non-causal), no other block.

    Example seq=4, B=2, anchors [[1, 3]] (columns: context 0..3 | blocks (1,0) (1,1)
    (3,0) (3,1)):
        (1,0)  [1, 0, 0, 0,  1, 1, 0, 0]
        (1,1)  [1, 0, 0, 0,  1, 1, 0, 0]
        (3,0)  [1, 1, 1, 0,  0, 0, 1, 1]
        (3,1)  [1, 1, 1, 0,  0, 0, 1, 1]
    """
    b, a = anchors.shape
    starts = anchors.repeat_interleave(block, dim=1)  # [batch, A*B] each query's anchor
    context = torch.arange(seq, device=anchors.device).view(1, 1, seq) < starts.unsqueeze(-1)
    owner = torch.arange(a, device=anchors.device).repeat_interleave(block)  # [A*B]
    own = (owner.unsqueeze(1) == owner.unsqueeze(0)).unsqueeze(0).expand(b, -1, -1)
    return torch.cat([context, own], dim=2)


def block_inputs(
    input_ids: torch.Tensor,  # [batch, seq]
    anchors: torch.Tensor,  # [batch, A]
    prefix: torch.Tensor,  # [batch, A] long: real slots per block (1: the anchor only)
    block: int,
    mask_token_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, positions) [batch, A, B]: slot j of anchor a sits at position a+j and holds
    x_{a+j} when j < prefix (and a+j < seq), else the mask token.

    Example x = [5, 6, 7, 8], anchors [[1]], prefix [[2]], B=3, mask 0 -> tokens
    [[[6, 7, 0]]], positions [[[1, 2, 3]]]."""
    b, t = input_ids.shape
    positions = anchors.unsqueeze(-1) + torch.arange(block, device=anchors.device)
    real = (torch.arange(block, device=anchors.device) < prefix.unsqueeze(-1)) & (positions < t)
    gathered = input_ids.gather(1, positions.clamp(max=t - 1).flatten(1)).view_as(positions)
    return torch.where(real, gathered, mask_token_id), positions


def slot_weights(block: int, gamma: float, device: torch.device | None = None) -> torch.Tensor:
    """[B-1] loss weights of slots 1..B-1: w_j = exp(-(j-1) / gamma).

    Example B=4, gamma=2: [1, e^-0.5, e^-1] = [1.0, 0.607, 0.368]."""
    j = torch.arange(1, block, device=device, dtype=torch.float32)
    return torch.exp(-(j - 1) / gamma)


def block_forward(
    head: DFlashHead,
    input_ids: torch.Tensor,  # [batch, seq]
    aux: torch.Tensor,  # [batch, seq, n_aux * h]
    anchors: torch.Tensor,  # [batch, A] long
    prefix: torch.Tensor,  # [batch, A] long: real slots per block (1: the anchor only)
    block: int,
) -> torch.Tensor:
    """Logits [batch, A, B, vocab] of every anchor's block from ONE forward: the context
    keys of all ``seq`` positions, each block masked to those before its anchor
    (``block_mask``) -- the same logits as ``head.draft_block`` over ``head.context_kv``
    of positions 0..a-1 for each anchor a."""
    b, t = input_ids.shape
    tokens, positions = block_inputs(input_ids, anchors, prefix, block, head.mask_token_id)
    ctx = head.context_kv(aux, torch.arange(t, device=aux.device).unsqueeze(0).expand(b, t))
    mask = block_mask(anchors, t, block)
    logits = head.block_logits(tokens.flatten(1), positions.flatten(1), ctx, mask)
    return logits.view(b, anchors.shape[1], block, logits.shape[-1])


def block_loss(
    head: DFlashHead,
    batch: HeadBatch,
    cap: Capture,
    block_size: int,
    gamma: float,
    anchors: int,
    variable_prefix: bool,
    partition: Partition | None,
) -> HeadLoss:
    """The decay-weighted DFlash loss (module docstring); one entry per slot j = 1..B-1 in
    ``step_losses`` / ``step_accuracy`` / ``step_counts``."""
    if block_size < 2 or gamma <= 0 or anchors < 1:
        raise ValueError(f"DFlash loss needs block_size >= 2, gamma > 0, anchors >= 1; got "
                         f"{block_size}, {gamma}, {anchors}")
    x, loss_mask = batch.input_ids, batch.loss_mask.bool()
    gen = None
    if partition is not None:  # every part draws the same anchors and prefixes
        gen = torch.Generator(device=x.device).manual_seed(partition.seed)
    eligible = torch.zeros_like(loss_mask)
    eligible[:, :-1] = loss_mask[:, 1:]  # x_{a+1} is trained
    picked, ok = pick_anchors(eligible, anchors, gen)  # [batch, A]
    prefix = torch.ones_like(picked)
    if variable_prefix:
        prefix = torch.randint(1, block_size, picked.shape, generator=gen,
                               device=gen.device if gen is not None else x.device).to(x.device)
    probs, in_vocab = head.target_distribution(cap)
    scored = _scored(picked, ok, prefix, loss_mask, in_vocab, block_size)  # [batch, A, B-1]
    weights = slot_weights(block_size, gamma, x.device)  # [B-1]
    totals = scored.sum((0, 1))  # [B-1] the whole step's scored slots (every part's)
    denominator = (totals.float() * weights).sum().clamp(min=1e-6)
    lo, hi = partition.bounds(picked.shape[1]) if partition is not None else (0, picked.shape[1])
    part = picked[:, lo:hi]
    logits = block_forward(head, x, cap.aux, part, prefix[:, lo:hi], block_size)[:, :, 1:]
    targets = _targets(probs, part, block_size)  # [batch, a, B-1, vocab]
    per_slot = -(targets * F.log_softmax(logits.float(), dim=-1)).sum(-1)  # [batch, a, B-1]
    valid = scored[:, lo:hi]
    result = HeadLoss(loss=(per_slot * valid * weights).sum() / denominator)
    with torch.no_grad():
        hits = (logits.argmax(-1) == targets.argmax(-1)) & valid
        _slot_stats(result, per_slot * valid, hits, valid, totals)
    return result


def _slot_stats(result: HeadLoss, losses: torch.Tensor, hits: torch.Tensor,
                valid: torch.Tensor, totals: torch.Tensor) -> None:
    """Per slot j (last dim of ``losses`` / ``hits`` / ``valid`` [batch, a, B-1]): the
    loss summed over the part's slots / the whole step's count ``totals[j]`` (parts add
    up: models/training/partition.py ``merged``), accuracy and count over the part."""
    for j in range(valid.shape[-1]):
        count = int(valid[..., j].sum())
        result.step_losses.append(float(losses[..., j].sum()) / max(int(totals[j]), 1))
        result.step_accuracy.append(float(hits[..., j].sum()) / max(count, 1))
        result.step_counts.append(count)


def _scored(
    picked: torch.Tensor,  # [batch, A]
    ok: torch.Tensor,  # [batch, A]
    prefix: torch.Tensor,  # [batch, A]
    loss_mask: torch.Tensor,  # [batch, seq]
    in_vocab: torch.Tensor,  # [batch, seq]
    block: int,
) -> torch.Tensor:
    """[batch, A, B-1] bool: slot j (1..B-1) of each anchor a is scored -- the anchor is
    eligible, a+j < seq, x_{a+j} is trained, the target's argmax at a+j-1 is in the head's
    vocabulary, and j >= the anchor's prefix. Example seq 5, a=3, B=4: slots 1 (x_4) only;
    slots 2 and 3 fall off the end."""
    t = loss_mask.shape[1]
    j = torch.arange(1, block, device=picked.device)
    pos = picked.unsqueeze(-1) + j  # [batch, A, B-1] position of the predicted token
    inside = pos < t
    flat = pos.clamp(max=t - 1).flatten(1)
    trained = loss_mask.gather(1, flat).view_as(pos)
    drafted = in_vocab.gather(1, (flat - 1)).view_as(pos)
    return ok.unsqueeze(-1) & inside & trained & drafted & (j >= prefix.unsqueeze(-1))


def _targets(probs: torch.Tensor, picked: torch.Tensor, block: int) -> torch.Tensor:
    """[batch, A, B-1, vocab]: the target's distribution at a+j-1 for slot j = 1..B-1
    (rows past the end repeat the last position; they are never scored)."""
    b, t, v = probs.shape
    pos = (picked.unsqueeze(-1) + torch.arange(block - 1, device=picked.device)).clamp(max=t - 1)
    rows = probs.gather(1, pos.flatten(1).unsqueeze(-1).expand(-1, -1, v))
    return rows.view(b, picked.shape[1], block - 1, v)
