"""Types and helpers shared by the draft heads (losses, greedy chains)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from eaglenest.models.heads.layers import KV, HeadConfig, causal_mask, shift_left

if TYPE_CHECKING:
    from eaglenest.models.target import Target


class DraftHead(Protocol):
    """What checkpoints, the trainer and the drafters use of every head (an nn.Module, whose
    ``__getattr__`` types any attribute as ``Tensor | Module``: see ``draft_head``)."""

    cfg: HeadConfig
    lm_head: nn.Linear  # over the head's vocabulary (the draft vocabulary, or the target's)

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             mask: torch.Tensor, past: KV | None = None, /,
             ) -> tuple[torch.Tensor, torch.Tensor, KV]: ...

    def to_target_ids(self, ids: torch.Tensor, /) -> torch.Tensor: ...


class AuxHead(DraftHead, Protocol):
    """A head over the target's aux hidden states (HeadSpec.uses_aux)."""

    def combine(self, aux: torch.Tensor, /) -> torch.Tensor: ...


class ParallelHead(AuxHead, Protocol):
    """A head that drafts K tokens in one forward (HeadSpec.parallel)."""

    def mask_slots(self, batch: int, seq: int, /) -> tuple[torch.Tensor, torch.Tensor]: ...


def draft_head(module: nn.Module) -> DraftHead:
    """``module`` (a models.heads head) seen through its interface."""
    return cast(DraftHead, module)


def mask_token_for(target: Target, configured: int | None) -> int:
    """The mask token of a head that fills slots not yet known (P-EAGLE, DFlash): the
    configured id (TrainConfig.mask_token_id), else the target's pad token, else its eos."""
    if configured is not None:
        return configured
    tok = target.tokenizer
    return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)


@dataclass
class HeadBatch:
    """One training batch, right-padded."""

    input_ids: torch.Tensor  # [batch, seq] long
    loss_mask: torch.Tensor  # [batch, seq] bool: token is an assistant token worth predicting
    attention_mask: torch.Tensor  # [batch, seq] long/bool: 1 = real token, 0 = padding


@dataclass(frozen=True)
class Partition:
    """Part ``index`` of ``count`` of a batch's anchor slots (sequence partitioning): the
    loss of the anchors in ``bounds(seq)`` only, normalised as the whole batch's, so the
    parts' losses (and gradients) sum to the unpartitioned ones. ``seed`` draws the random
    slot choices (P-EAGLE's COD) the same way in every part.

    Example seq=10, count=3: bounds (0, 3), (3, 6), (6, 10)."""

    index: int
    count: int
    seed: int

    def bounds(self, seq: int) -> tuple[int, int]:
        return self.index * seq // self.count, (self.index + 1) * seq // self.count


@dataclass
class HeadLoss:
    loss: torch.Tensor  # scalar, differentiable
    step_losses: list[float] = field(default_factory=list)  # one per draft step / depth
    step_accuracy: list[float] = field(default_factory=list)  # greedy draft == target argmax
    step_counts: list[int] = field(default_factory=list)  # positions scored per step


def soft_cross_entropy(
    logits: torch.Tensor,  # [batch, seq, vocab] draft logits
    target_probs: torch.Tensor,  # [batch, seq, vocab] target distribution (same vocab)
    valid: torch.Tensor,  # [batch, seq] bool
    denominator: int | None = None,
) -> tuple[torch.Tensor, float, int]:
    """Masked mean of -sum(p * log q) (a sum over ``denominator`` positions when given: a
    part of a partitioned batch); also the greedy agreement rate and count of ``valid``."""
    logq = F.log_softmax(logits.float(), dim=-1)
    per_pos = -(target_probs * logq).sum(-1)  # [batch, seq]
    count = int(valid.sum())
    validf = valid.to(per_pos.dtype)
    loss = (per_pos * validf).sum() / max(count if denominator is None else denominator, 1)
    with torch.no_grad():
        hit = (logits.argmax(-1) == target_probs.argmax(-1)) & valid
        acc = float(hit.sum()) / max(count, 1)
    return loss, acc, count


def scored_steps(
    step_logits: list[torch.Tensor],  # per step j: [batch, seq, vocab], slot i predicts x[i+2+j]
    probs: torch.Tensor,  # [batch, seq, vocab] target distribution; position p predicts x[p+1]
    in_vocab: torch.Tensor,  # [batch, seq] bool: target argmax at p is in the head's vocab
    loss_mask: torch.Tensor,  # [batch, seq] bool: x[p] is a trainable (assistant) token
    decay: float,
    keep: torch.Tensor | None = None,  # [steps, seq] bool: slots trained at each step
    count_keep: torch.Tensor | None = None,  # [steps, seq] bool: slots each mean is over
    window: tuple[int, int] | None = None,  # step_logits hold slots lo..hi-1 only
) -> HeadLoss:
    """Sum over steps of decay**j * masked soft CE; step j at slot i is scored against the
    target's distribution at position i+1+j where x[i+2+j] is an assistant token. With
    ``count_keep`` (a partition's part: ``keep`` its share of ``count_keep``), each step's
    loss sums over ``keep`` and divides by the positions ``count_keep`` scores; with
    ``window`` = (lo, hi) the logits are [batch, hi - lo, vocab] for slots lo..hi-1 and only
    those are scored (the target's distribution is read for them alone).

    Example (seq=5, step j=1): slot 0 is scored against probs[2] if loss_mask[3]; slots 3
    and 4 fall off the end (shift fills False) and are never scored.
    """
    total = torch.zeros((), device=probs.device)
    result = HeadLoss(loss=total)
    lo, hi = window or (0, probs.shape[1])
    for j, logits in enumerate(step_logits):
        target = shift_left(probs, 1 + j) if window is None else _rows(probs, lo + 1 + j, hi - lo)
        valid = shift_left(loss_mask, 2 + j, False) & shift_left(in_vocab, 1 + j, False)
        counted = valid if count_keep is None else valid & count_keep[j].unsqueeze(0)
        if keep is not None:
            valid = valid & keep[j].unsqueeze(0)
        valid = valid[:, lo:hi]
        step_loss, acc, count = soft_cross_entropy(
            logits, target, valid, None if count_keep is None else int(counted.sum()))
        total = total + (decay**j) * step_loss
        result.step_losses.append(float(step_loss.detach()))
        result.step_accuracy.append(acc)
        result.step_counts.append(count)
    result.loss = total
    return result


def _rows(x: torch.Tensor, start: int, n: int) -> torch.Tensor:
    """``x[:, start : start + n]``, zero rows past the end. Example seq 5, start 3, n 3 ->
    rows 3, 4 and one of zeros."""
    part = x[:, start : start + n]
    if part.shape[1] == n:
        return part
    pad = x.new_zeros(x.shape[0], n - part.shape[1], *x.shape[2:])
    return torch.cat([part, pad], dim=1)


StepFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, KV | None],
    tuple[torch.Tensor, torch.Tensor, KV],
]


@torch.no_grad()
def greedy_chain(
    step: StepFn,
    to_target: Callable[[torch.Tensor], torch.Tensor],
    slot_tokens: torch.Tensor,  # [1, n] token fed at each context slot
    slot_hidden: torch.Tensor,  # [1, n, hidden] hidden fed at each context slot
    k: int,
) -> torch.Tensor:
    """Prefill the context slots, then draft k tokens one at a time; returns [k] target ids.

    ``step(tokens, hidden, positions, mask, past) -> (logits, next_hidden, kv)``; logits are
    over the head's own vocabulary and ``to_target`` maps argmax ids to target ids.
    """
    n = slot_tokens.shape[1]
    device = slot_tokens.device
    positions = torch.arange(n, device=device).unsqueeze(0)
    logits, hidden, past = step(
        slot_tokens, slot_hidden, positions, causal_mask(n, 0, device), None
    )
    drafts = []
    token = to_target(logits[:, -1].argmax(-1))  # [1]
    hidden = hidden[:, -1:]
    for j in range(k):
        drafts.append(token)
        if j == k - 1:
            break
        pos = torch.full((1, 1), n + j, device=device, dtype=torch.long)
        logits, hidden, past = step(
            token.view(1, 1), hidden, pos, causal_mask(1, past[0].shape[2], device), past
        )
        token = to_target(logits[:, -1].argmax(-1))
    return torch.cat(drafts)
