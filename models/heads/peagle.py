"""P-EAGLE head: an EAGLE-3 head that drafts K tokens in one forward pass.

On top of EAGLE-3 it learns ``mask_hidden`` [1, 1, n_aux * hidden], a stand-in for the
target features of positions not yet known, and uses ``mask_token_id`` as their input
token. vLLM serves it as ``{"method": "eagle3", "parallel_drafting": true}``: after the
real context slots it appends K - 1 slots holding (mask_token_id, fc(mask_hidden)) at the
following positions and reads all K drafts from that single forward.

Training lays the same thing out for every anchor slot i at once: block 0 holds the real
slots (token x[i+1], fused features of i, position i, predicts x[i+2]); block k >= 1 holds
anchor i's k-th mask slot (mask token, fc(mask_hidden), position i+k, predicts x[i+2+k]).
Conditional drop-token (COD, from PARD) keeps anchor i's depth k only where it kept depth
k-1, so every kept slot still has its whole prefix -- the KV a real chain would have.

Sequence partitioning (the P-EAGLE paper's, for long samples): ``loss(partition=...)`` runs
one part of the anchors [a, b) -- block 0 for slots 0..b-1 (the keys the part's queries
read; block 0 attends only to itself, causally, so these are exactly the full forward's)
and the mask slots of anchors a..b-1 -- and scores only the part's anchors, normalised as
the whole batch. The parts' gradients sum to the whole forward's while one part holds at
most b + (depth - 1) * (b - a) slots instead of depth * seq. models/training/partition.py runs the
parts, one backward each.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from eaglenest.models.heads.base import HeadBatch, HeadLoss, Partition, scored_steps
from eaglenest.models.heads.eagle3 import Eagle3Head, layer_config
from eaglenest.models.heads.layers import HeadConfig, causal_mask, shift_left, ttt_mask
from eaglenest.models.heads.vocab import draft_vocab_for
from eaglenest.models.target import Capture
from eaglenest.models.training.config import TrainConfig

if TYPE_CHECKING:
    from eaglenest.models.data.template import Sample
    from eaglenest.models.target import Target


def parallel_mask(seq: int, depth: int, device: torch.device | None = None) -> torch.Tensor:
    """[depth * seq, depth * seq] bool mask over (block, slot) queries and keys.

    Query block k is ``ttt_mask(seq, k)`` padded with zeros for blocks deeper than k: block 0
    causally, then anchor i's own mask slots at depths 1..k.

    Example seq=2, depth=2 (rows/cols: b0s0, b0s1, b1s0, b1s1):
        [[1, 0, 0, 0],
         [1, 1, 0, 0],
         [1, 0, 1, 0],
         [1, 1, 0, 1]]
    """
    rows = []
    for k in range(depth):
        block = ttt_mask(seq, k, device)
        pad = torch.zeros(seq, seq * (depth - 1 - k), dtype=torch.bool, device=device)
        rows.append(torch.cat([block, pad], dim=1))
    return torch.cat(rows, dim=0)


def slot_mask(idx: torch.Tensor, seq: int) -> torch.Tensor:
    """``parallel_mask(seq, depth)[idx][:, idx]`` for flat slot indices ``idx`` (block k slot
    i -> k * seq + i), built for those slots only ([n, n], not [depth * seq]^2): query (k, i)
    sees block-0 keys (0, j) with j <= i and its own anchor's mask slots (m, i), 1 <= m <= k.

    Example seq=2, idx=[0, 1, 3] (b0s0, b0s1, b1s1): [[1, 0, 0], [1, 1, 0], [1, 1, 1]].
    """
    block, slot = idx // seq, idx % seq  # [n] each
    qk, qi = block.unsqueeze(1), slot.unsqueeze(1)  # queries down the rows
    kk, ki = block.unsqueeze(0), slot.unsqueeze(0)  # keys along the columns
    return ((kk == 0) & (ki <= qi)) | ((kk >= 1) & (ki == qi) & (kk <= qk))


def cod_keep(
    seq: int, depth: int, keep_prob: float, device: torch.device | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """[depth, seq] bool: which (depth, anchor) slots to train. Row 0 is always kept.

    keep[k, i] = keep[k-1, i] and u < keep_prob (u uniform, from ``generator``, else the
    global torch RNG). Example keep_prob=1.0 -> all True; keep_prob=0.0 -> only row 0.
    """
    keep = torch.ones(depth, seq, dtype=torch.bool, device=device)
    if depth > 1:
        draws = torch.rand(depth - 1, seq, device=device, generator=generator) < keep_prob
        keep[1:] = torch.cumprod(draws.long(), dim=0).bool()
    return keep


class PEagleHead(Eagle3Head):
    """EAGLE-3 head plus ``mask_hidden`` and ``mask_token_id`` for parallel drafting."""

    def __init__(self, cfg: HeadConfig, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        super().__init__(cfg, d2t, t2d)
        if cfg.mask_token_id is None or not 0 <= cfg.mask_token_id < cfg.vocab_size:
            raise ValueError("P-EAGLE heads need a mask_token_id inside the target vocabulary")
        self.mask_token_id: int = cfg.mask_token_id
        width = len(cfg.aux_layer_ids) * cfg.hidden_size
        self.mask_hidden = nn.Parameter(torch.randn(1, 1, width) * 0.02)

    def mask_slots(self, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [batch, seq], hidden [batch, seq, hidden]) for ``seq`` mask slots."""
        tokens = torch.full((batch, seq), self.mask_token_id, device=self.d2t.device)
        hidden = self.combine(self.mask_hidden).expand(batch, seq, -1)
        return tokens, hidden

    def parallel_forward(
        self,
        input_ids: torch.Tensor,  # [batch, seq] teacher tokens
        aux: torch.Tensor,  # [batch, seq, n_aux * hidden]
        depth: int,
        keep: torch.Tensor,  # [depth, seq] bool from cod_keep
        window: tuple[int, int] | None = None,
    ) -> list[torch.Tensor]:
        """Draft-vocab logits [batch, seq, draft_vocab] per depth from ONE forward.

        Depth k, slot i: anchor i's k-th draft (predicts x[i+2+k]); dropped slots are 0.
        With ``window`` = (lo, hi): [batch, hi - lo, draft_vocab], anchors lo..hi-1 only.
        """
        b, t = input_ids.shape
        device = input_ids.device
        mask_tokens, mask_hidden = self.mask_slots(b, t)
        tokens = [shift_left(input_ids, 1)] + [mask_tokens] * (depth - 1)
        hidden = [self.combine(aux)] + [mask_hidden] * (depth - 1)
        base = torch.arange(t, device=device).unsqueeze(0).expand(b, t)
        positions = [base + k for k in range(depth)]
        # flat index over (block, slot): block k slot i -> k * t + i; sorted, so each block's
        # kept slots stay contiguous. Example t=3, keep=[[1,1,1],[1,0,1]] -> [0,1,2,3,5].
        idx = keep.flatten().nonzero().squeeze(1)
        mask = slot_mask(idx, t)
        flat, _, _ = self.step(
            torch.cat(tokens, 1)[:, idx],
            torch.cat(hidden, 1)[:, idx],
            torch.cat(positions, 1)[:, idx],
            mask,
        )
        lo, hi = window or (0, t)
        out, start = [], 0
        for k in range(depth):
            slots = keep[k].nonzero().squeeze(1)  # anchors kept at depth k
            inside = (slots >= lo) & (slots < hi)
            full = flat.new_zeros(b, hi - lo, flat.shape[-1])
            full[:, slots[inside] - lo] = flat[:, start : start + slots.numel()][:, inside]
            start += slots.numel()
            out.append(full)
        return out

    def loss(
        self,
        batch: HeadBatch,
        cap: Capture,
        steps: int = 4,
        decay: float = 0.8,
        keep_prob: float = 0.7,
        partition: Partition | None = None,
    ) -> HeadLoss:
        """One forward over the kept (depth, anchor) slots; depth k weighted decay**k. With
        ``partition``, its part of the anchors only (module docstring)."""
        seq, device = batch.input_ids.shape[1], batch.input_ids.device
        gen = None
        if partition is not None:  # every part draws the same slots
            gen = torch.Generator(device=device).manual_seed(partition.seed)
        keep = cod_keep(seq, steps, keep_prob, device, gen)  # [steps, seq]
        probs, in_vocab = self.target_distribution(cap)
        loss_mask = batch.loss_mask.bool()
        if partition is None:
            logits = self.parallel_forward(batch.input_ids, cap.aux, steps, keep)
            return scored_steps(logits, probs, in_vocab, loss_mask, decay, keep)
        a, b = partition.bounds(seq)
        run = keep.clone()  # block 0 up to b (the part's keys), mask slots of a..b-1
        run[0, b:] = False
        run[1:, :a] = False
        run[1:, b:] = False
        scored = torch.zeros_like(keep)
        scored[:, a:b] = keep[:, a:b]
        logits = self.parallel_forward(batch.input_ids, cap.aux, steps, run, (a, b))
        return scored_steps(logits, probs, in_vocab, loss_mask, decay, scored, count_keep=keep,
                            window=(a, b))

    @torch.no_grad()
    def draft_parallel(
        self,
        tokens: torch.Tensor,  # [1, n + 1]: context x[0..n-1] plus the target's next token
        aux: torch.Tensor,  # [1, n, n_aux * hidden]
        k: int,
    ) -> torch.Tensor:
        """All k drafts (target ids, [k]) from one forward, as vLLM's parallel drafting does."""
        n = aux.shape[1]
        mask_tokens, mask_hidden = self.mask_slots(1, k - 1)
        slot_tokens = torch.cat([tokens[:, 1:], mask_tokens], dim=1)  # [1, n + k - 1]
        slot_hidden = torch.cat([self.combine(aux), mask_hidden], dim=1)
        positions = torch.arange(n + k - 1, device=aux.device).unsqueeze(0)
        mask = causal_mask(n + k - 1, 0, aux.device)
        logits, _, _ = self.step(slot_tokens, slot_hidden, positions, mask)
        return self.to_target_ids(logits[0, n - 1 :].argmax(-1))


# ---- registry builder (models/heads/registry.py) ----------------------------------------
def build(target: Target, samples: list[Sample], config: TrainConfig) -> PEagleHead:
    """An EAGLE-3 layout plus the mask token (default: pad, else eos) (registry builder)."""
    d2t, t2d = draft_vocab_for(target, samples, config.draft_vocab_size)
    mask_id = _mask_token(target, config)
    head = PEagleHead(layer_config(target, d2t, config, mask_token_id=mask_id), d2t, t2d)
    head.init_from_target(target.embed_weight(), target.lm_head_weight())
    return head


def from_eagle3(head: Eagle3Head, target: Target, config: TrainConfig) -> PEagleHead:
    """A P-EAGLE head that starts as a trained EAGLE-3 head (registry ``start_path``).

    Both read the same aux layers through the same fc, decoder layers, norm and draft
    vocabulary, so every EAGLE-3 tensor is copied as it is (its layout, norms and layer
    count included; the TrainConfig's own layout fields do not apply); only ``mask_hidden``
    is new. Its first draft is then EAGLE-3's from the first step, and training teaches
    the mask slots.
    """
    cfg = replace(head.cfg, mask_token_id=_mask_token(target, config))
    new = PEagleHead(cfg, head.d2t.clone(), head.t2d.clone())
    missing, unexpected = new.load_state_dict(head.state_dict(), strict=False)
    if unexpected or missing != ["mask_hidden"]:
        raise ValueError(f"not an EAGLE-3 layout: missing {missing}, unexpected {unexpected}")
    return new


def _mask_token(target: Target, config: TrainConfig) -> int:
    if config.mask_token_id is not None:
        return config.mask_token_id
    tok = target.tokenizer
    return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
