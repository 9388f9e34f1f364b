"""Block drafting (DFlash heads, HeadSpec.block): a request's context K/V cache and the
drafter that proposes a whole block in ONE head forward, for one request or a batch.

Context convention (models/heads, the shared DFlash design): context position i holds the
draft layers' keys/values projected from the target's aux hidden states of token x[i]
(``head.context_kv``). After the target has run x[0..n-1] and the next token x[n] is known
(the engine's ``pending`` token), the cache holds exactly positions 0..n-1 and a round's
block is [x[n], MASK, ..., MASK] at positions n..n+K: block slot j (1 <= j <= K) proposes
x[n+j], all from one non-causal forward (``head.draft_block``).

The drafter keeps ``HeadDrafter``'s interface (``extend(tokens, feats)`` with the tokens
x[i+1] and the features of positions i), so the engines commit a round's accepted rows the
same way for every head: ``extend`` appends their context K/V and takes the last token
(x[n], the next round's anchor). Only verified tokens ever enter the cache, so it never
holds a rejected draft; ``crop`` cuts it back to a given length all the same.

Worked example (one request, K = 3): prompt x0..x4 prefilled, first token x5 ->
``extend([x1..x5], aux rows 0..4)``: cache positions 0..4, anchor x5 at position 5; the
block [x5, M, M, M] at positions 5..8 drafts d6, d7, d8; the target accepts d6 and
corrects x7 -> ``extend([d6, x7], aux rows 0..1 of the verification)``: positions 5..6
appended (x5 and d6), anchor x7 at position 7.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast

import torch
from torch import nn

from eaglenest.models.decode.drafter import HeadDrafter
from eaglenest.models.decode.sampling import SamplingParams
from eaglenest.models.heads.layers import KV, HeadConfig

Draft = tuple[list[int], torch.Tensor | None]  # (target ids, q [k, vocab] or None)


class BlockHead(Protocol):
    """What block drafting uses of a block head (models/heads/dflash.py)."""

    cfg: HeadConfig
    lm_head: nn.Linear

    def to_target_ids(self, ids: torch.Tensor, /) -> torch.Tensor: ...

    def context_kv(self, aux: torch.Tensor, positions: torch.Tensor, /) -> list[KV]: ...

    def draft_block(self, anchor: torch.Tensor, position: torch.Tensor, ctx: list[KV],
                    block_len: int, ctx_mask: torch.Tensor | None = None, /) -> torch.Tensor: ...


class ContextCache:
    """One request's context K/V per draft layer, positions 0..length-1.

    Each layer's keys and values live in a buffer [1, kv_heads, capacity, head_dim] that
    doubles when full, so appending a round's m positions writes those m columns only
    (amortised) and ``crop`` just moves the length. Example: capacity 4 holding 3
    positions, append 2 -> capacity 8 (the 3 copied once), length 5; crop(4) -> length 4,
    and the next append writes from column 4.
    """

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []  # per layer [1, kv_heads, capacity, head_dim]
        self.values: list[torch.Tensor] = []
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def append(self, kv: Sequence[KV]) -> None:
        """Add m positions after the last: kv per layer, keys/values [1, kv_heads, m, d]."""
        m = kv[0][0].shape[2]
        need = self.length + m
        if need > self.capacity:
            self._grow(kv, max(need, 2 * self.capacity, 16))
        for layer, (k, v) in enumerate(kv):
            self.keys[layer][:, :, self.length : need] = k
            self.values[layer][:, :, self.length : need] = v
        self.length = need

    def _grow(self, like: Sequence[KV], capacity: int) -> None:
        keys, values = [], []
        for layer, (k, v) in enumerate(like):
            shape = (1, k.shape[1], capacity, k.shape[3])
            keys.append(k.new_zeros(shape))
            values.append(v.new_zeros(shape[:3] + (v.shape[3],)))
            if self.keys:
                keys[-1][:, :, : self.length] = self.keys[layer][:, :, : self.length]
                values[-1][:, :, : self.length] = self.values[layer][:, :, : self.length]
        self.keys, self.values = keys, values

    def crop(self, length: int) -> None:
        """Keep positions 0..length-1."""
        if not 0 <= length <= self.length:
            raise ValueError(f"crop to {length}: the cache holds {self.length} positions")
        self.length = length

    def layers(self) -> list[KV]:
        """Per layer (keys, values) [1, kv_heads, length, head_dim] (views, no copy)."""
        n = self.length
        return [(k[:, :, :n], v[:, :, :n]) for k, v in zip(self.keys, self.values, strict=True)]


class BlockDrafter(HeadDrafter):
    """Drafts for one request with a block head: its ``ContextCache`` and anchor token."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__(head)
        self.block = cast(BlockHead, self.head)
        self.block_size = int(self.block.cfg.block_size or 0)

    def reset(self) -> None:
        super().reset()
        self.ctx = ContextCache()
        self.anchor: int | None = None  # x[n], the next block's slot 0

    @property
    def has_context(self) -> bool:
        return self.ctx.length > 0 and self.anchor is not None

    def combine(self, inputs: torch.Tensor) -> torch.Tensor:
        """The aux states as they are: the head fuses them inside ``context_kv``."""
        return inputs

    @torch.no_grad()
    def extend(self, tokens: list[int], feats: torch.Tensor) -> None:
        """Commit m positions: feats [m, n_aux * hidden] aux states of positions
        slots..slots+m-1; ``tokens[-1]`` (x[slots + m]) becomes the anchor."""
        self.crop()
        m = len(tokens)
        positions = torch.arange(self.slots, self.slots + m, device=self.device)[None]  # [1, m]
        self.ctx.append(self.block.context_kv(feats[None], positions))
        self.slots += m
        self.anchor = int(tokens[-1])

    def crop(self) -> None:
        """The cache back to the committed positions 0..slots-1."""
        if self.ctx.length > self.slots:
            self.ctx.crop(self.slots)

    @torch.no_grad()
    def draft_block(
        self, k: int, params: SamplingParams, gen: torch.Generator | None
    ) -> Draft:
        """k drafts (x[n+1..n+k]) from ONE forward over the block [anchor, MASK x k]:
        (target ids, q [k, vocab] or None if greedy); k = 0 drafts nothing."""
        self.crop()
        if k <= 0:
            return [], None
        assert self.anchor is not None, "extend() first"
        anchor = torch.tensor([[self.anchor]], device=self.device)  # [1, 1]
        position = torch.tensor([self.slots], device=self.device)  # [1]
        logits = self.block.draft_block(anchor, position, self.ctx.layers(), k + 1)  # [1, k, V]
        return collect([self.pick(row, params, gen) for row in logits[0]], params)


def collect(picks: list[tuple[int, torch.Tensor | None]], params: SamplingParams) -> Draft:
    """Picks (target id, q or None) -> (ids, q [k, vocab] stacked, None when greedy)."""
    drafts = [t for t, _ in picks]
    if params.greedy:
        return drafts, None
    return drafts, torch.stack([q for _, q in picks if q is not None])


# ---- a batch of requests --------------------------------------------------------------------
def padded_context(drafters: Sequence[BlockDrafter]) -> tuple[list[KV], torch.Tensor]:
    """Every row's context side by side, right-padded with zeros to the longest:
    (per layer keys/values [B, kv_heads, P, d], valid [B, P] bool). Keys carry RoPE of
    their own positions, so a padded column is harmless once masked.

    Example lengths 3 and 1, P = 3: valid [[1, 1, 1], [1, 0, 0]]."""
    for d in drafters:
        d.crop()
    lengths = [d.ctx.length for d in drafters]
    width = max(lengths)
    layers = []
    for layer in range(len(drafters[0].ctx.keys)):
        k0, v0 = drafters[0].ctx.keys[layer], drafters[0].ctx.values[layer]
        keys = k0.new_zeros(len(drafters), k0.shape[1], width, k0.shape[3])
        values = v0.new_zeros(len(drafters), v0.shape[1], width, v0.shape[3])
        for i, d in enumerate(drafters):
            keys[i, :, : lengths[i]] = d.ctx.keys[layer][0, :, : lengths[i]]
            values[i, :, : lengths[i]] = d.ctx.values[layer][0, :, : lengths[i]]
        layers.append((keys, values))
    device = drafters[0].device
    valid = torch.arange(width, device=device)[None] < torch.tensor(lengths, device=device)[:, None]
    return layers, valid


@torch.no_grad()
def draft_batch(drafters: list[BlockDrafter], k: int, params: list[SamplingParams],
                gens: list[torch.Generator | None]) -> list[Draft]:
    """k drafts per row from ONE batched block forward (as ``BlockDrafter.draft_block``):
    row b's block sits at its own position n_b and sees its own context only."""
    if k <= 0:
        return [([], None) for _ in drafters]
    head, device = drafters[0].block, drafters[0].device
    ctx, valid = padded_context(drafters)
    anchors = torch.tensor([[d.anchor] for d in drafters], device=device)  # [B, 1]
    positions = torch.tensor([d.slots for d in drafters], device=device)  # [B]
    logits = head.draft_block(anchors, positions, ctx, k + 1, valid)  # [B, k, V]
    return [collect([d.pick(row, p, g) for row in logits[i]], p)
            for i, (d, p, g) in enumerate(zip(drafters, params, gens, strict=True))]


@torch.no_grad()
def extend_batch(drafters: list[BlockDrafter], tokens: list[list[int]],
                 feats: list[torch.Tensor]) -> None:
    """``extend`` for every row in one ``context_kv`` call: tokens[b] [m_b], feats[b]
    [m_b, n_aux * hidden]. Context positions do not attend to each other, so rows are
    padded to the longest m by repeating their last feature and the padding is dropped.

    Example m = [2, 1]: row 1's features [f0, f0] at positions [n1, n1 + 1]; only column 0
    of row 1 is appended."""
    device, m = drafters[0].device, max(len(t) for t in tokens)
    aux = torch.stack([torch.cat([f, f[-1:].expand(m - len(f), -1)]) for f in feats])
    slots = torch.tensor([d.slots for d in drafters], device=device)
    positions = slots[:, None] + torch.arange(m, device=device)[None]  # [B, m]
    kv = drafters[0].block.context_kv(aux, positions)  # per layer [B, kv_heads, m, d]
    for i, d in enumerate(drafters):
        d.crop()
        n = len(tokens[i])
        d.ctx.append([(k[i : i + 1, :, :n], v[i : i + 1, :, :n]) for k, v in kv])
        d.slots += n
        d.anchor = int(tokens[i][-1])
