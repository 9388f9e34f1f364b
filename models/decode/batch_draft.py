"""Drafting for a whole batch of requests: one head forward per draft step, not one per row.

Every request keeps its own ``HeadDrafter`` (its committed head KV, last logits and output),
as in batch-1 decoding. A batched forward lays those caches side by side, padded on the right
to the longest (keys are stored after RoPE, so a key's column does not matter, only whether
the mask lets a query see it), appends the same number of new columns to every row and masks
the padding. Drafts (chain and P-EAGLE parallel) are thrown away after verification, so they
never leave the padded tensors; committed slots (``extend``) are cut out per row and appended
to that row's own cache.

Worked example: rows A (3 committed slots) and B (1), a chain of k = 3 (two head steps):
    padded past, width P = 3:    A = [a0 a1 a2]   B = [b0 __ __]
    step 0 (A's and B's first drafts as tokens), mask over [past | new]:
        A: [1 1 1 | 1]           B: [1 0 0 | 1]
    step 1 (second drafts; the new column of step 0 stays in the cache):
        A: [1 1 1 | 1 1]         B: [1 0 0 | 1 1]
  and positions are A: 3, 4 and B: 1, 2 (each row's own slot count plus the step).

Only ``HeadDrafter`` rows sharing one head are batched; anything else (oracle drafters in
tests, tree drafting) stays per row in models/decode/batch.py. Block heads (DFlash) batch
their rows the same way in models/decode/block.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeGuard, cast

import torch

from eaglenest.models.decode import block
from eaglenest.models.decode.block import BlockDrafter
from eaglenest.models.decode.drafter import HeadDrafter
from eaglenest.models.decode.modes import ModeSpec
from eaglenest.models.decode.sampling import SamplingParams
from eaglenest.models.heads.base import ParallelHead
from eaglenest.models.heads.layers import KV

Draft = tuple[list[int], torch.Tensor | None]  # (target ids, q [k, vocab] or None)


def own(drafter: HeadDrafter | None) -> TypeGuard[HeadDrafter]:
    """A drafter of the engines' own (HeadDrafter, BlockDrafter: a head's), not a stand-in
    (tests' and benchmarks' oracles): its slots may be deferred and batched."""
    return type(drafter) in (HeadDrafter, BlockDrafter)


def batchable(drafters: Sequence[HeadDrafter | None]) -> bool:
    """True when every row drafts with the same drafter class of ``own`` over the same head
    (and there are two+)."""
    rows = [d for d in drafters if own(d) and type(d) is type(drafters[0])]
    if len(drafters) < 2 or len(rows) < len(drafters):
        return False
    head = rows[0].head
    return all(d.head is head and d.has_context for d in rows)


def _padded_past(drafters: list[HeadDrafter]) -> tuple[KV, torch.Tensor]:
    """(keys, values [B, kv_heads, P, head_dim] right-padded with zeros, valid [B, P] bool)."""
    for d in drafters:
        d.crop()
    lengths = [d.slots for d in drafters]
    width = max(lengths)
    first = drafters[0].past
    assert first is not None
    b, (_, heads, _, dim) = len(drafters), first[0].shape
    keys = first[0].new_zeros(b, heads, width, dim)
    values = first[1].new_zeros(b, heads, width, dim)
    for i, d in enumerate(drafters):
        assert d.past is not None
        keys[i, :, : lengths[i]] = d.past[0][0]
        values[i, :, : lengths[i]] = d.past[1][0]
    valid = torch.arange(width, device=keys.device)[None] < torch.tensor(
        lengths, device=keys.device)[:, None]
    return (keys, values), valid


def _mask(valid: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """[B, P] past validity + [B, q, q] among the new columns -> [B, q, P + q] bool."""
    q = new.shape[1]
    return torch.cat([valid[:, None, :].expand(-1, q, -1), new], dim=2)


def draft_chain(
    drafters: list[HeadDrafter],
    k: int,
    params: list[SamplingParams],
    gens: list[torch.Generator | None],
) -> list[Draft]:
    """k drafts per row, one batched head step per draft after the first (as draft_chain)."""
    if k <= 0:
        return [([], None) for _ in drafters]
    picks = [d.pick(d.last()[0], p, g) for d, p, g in zip(drafters, params, gens, strict=True)]
    rows: list[list[tuple[int, torch.Tensor | None]]] = [[pk] for pk in picks]
    if k > 1:
        head, device = drafters[0].head, drafters[0].device
        past, valid = _padded_past(drafters)
        slots = torch.tensor([d.slots for d in drafters], device=device)
        hidden = torch.cat([d.last()[1] for d in drafters])  # [B, 1, h]
        for j in range(k - 1):
            tokens = torch.tensor([[r[-1][0]] for r in rows], device=device)  # [B, 1]
            new = torch.ones(len(drafters), 1, j + 1, dtype=torch.bool, device=device)
            logits, hidden, past = head.step(tokens, hidden, (slots + j)[:, None],
                                             _mask(valid, new), past)
            for i, (d, p, g) in enumerate(zip(drafters, params, gens, strict=True)):
                rows[i].append(d.pick(logits[i, 0], p, g))
    return [_collect(r, p) for r, p in zip(rows, params, strict=True)]


def draft_parallel(drafters: list[HeadDrafter], k: int, params: list[SamplingParams],
                   gens: list[torch.Generator | None]) -> list[Draft]:
    """P-EAGLE: k drafts per row from ONE batched forward over k - 1 mask slots per row
    (``draft_chain``'s parameters and result)."""
    if k <= 0:
        return [([], None) for _ in drafters]
    assert drafters[0].parallel  # a parallel head (HeadSpec.parallel) has mask slots
    head = cast(ParallelHead, drafters[0].head)
    logit_rows = [[d.last()[0]] for d in drafters]
    if k > 1:
        device, b = drafters[0].device, len(drafters)
        past, valid = _padded_past(drafters)
        tokens, hidden = head.mask_slots(b, k - 1)  # [B, k-1], [B, k-1, hidden]
        slots = torch.tensor([d.slots for d in drafters], device=device)
        positions = slots[:, None] + torch.arange(k - 1, device=device)[None]
        causal = torch.ones(k - 1, k - 1, dtype=torch.bool, device=device).tril()
        logits, _, _ = head.step(tokens, hidden, positions,
                                 _mask(valid, causal.expand(b, -1, -1)), past)
        for i in range(b):
            logit_rows[i].extend(logits[i])
    out = []
    for d, p, g, rows in zip(drafters, params, gens, logit_rows, strict=True):
        out.append(_collect([d.pick(row, p, g) for row in rows], p))
    return out


def _collect(picks: list[tuple[int, torch.Tensor | None]], params: SamplingParams) -> Draft:
    drafts = [t for t, _ in picks]
    if params.greedy:
        return drafts, None
    return drafts, torch.stack([q for _, q in picks if q is not None])


@torch.no_grad()
def extend(drafters: list[HeadDrafter], tokens: list[list[int]],
           feats: list[torch.Tensor]) -> None:
    """Commit m_b new slots to every row in one forward (as HeadDrafter.extend per row).

    tokens[b]: [m_b] ids x[i+1]; feats[b]: [m_b, hidden] features of i. Rows are padded to
    the longest m with a repeated last token (masked out, and their columns dropped).
    """
    head, device = drafters[0].head, drafters[0].device
    b, m = len(drafters), max(len(t) for t in tokens)
    past, valid = _padded_past(drafters)
    width = valid.shape[1]
    ids = torch.tensor([t + [t[-1]] * (m - len(t)) for t in tokens], device=device)  # [B, m]
    hidden = torch.stack([torch.cat([f, f[-1:].expand(m - len(f), -1)]) for f in feats])
    slots = torch.tensor([d.slots for d in drafters], device=device)
    positions = slots[:, None] + torch.arange(m, device=device)[None]  # [B, m]
    causal = torch.ones(m, m, dtype=torch.bool, device=device).tril()
    logits, out, (keys, values) = head.step(ids, hidden, positions,
                                            _mask(valid, causal.expand(b, -1, -1)), past)
    for i, d in enumerate(drafters):
        n = len(tokens[i])
        assert d.past is not None
        new_k = keys[i : i + 1, :, width : width + n]
        new_v = values[i : i + 1, :, width : width + n]
        d.past = (torch.cat([d.past[0], new_k], dim=2), torch.cat([d.past[1], new_v], dim=2))
        d.slots += n
        d.last_logits = logits[i, n - 1]
        d.last_out = out[i : i + 1, n - 1 : n]


def draft_rows(mode: ModeSpec, drafters: list[HeadDrafter], k: int,
               params: list[SamplingParams], gens: list[torch.Generator | None]) -> list[Draft]:
    """A sequence mode's k drafts for every row (``batchable`` rows): one batched block
    forward (block heads), one forward over mask slots (parallel) or k - 1 head steps."""
    if mode.block:
        return block.draft_batch(cast(list[BlockDrafter], drafters), k, params, gens)
    if mode.parallel:
        return draft_parallel(drafters, k, params, gens)
    return draft_chain(drafters, k, params, gens)


def extend_rows(mode: ModeSpec, drafters: list[HeadDrafter], tokens: list[list[int]],
                feats: list[torch.Tensor]) -> None:
    """Commit every row's new slots in one batched head forward (``extend``; block heads:
    one ``context_kv`` call, block.extend_batch)."""
    if mode.block:
        block.extend_batch(cast(list[BlockDrafter], drafters), tokens, feats)
    else:
        extend(drafters, tokens, feats)
