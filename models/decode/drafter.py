"""Adapter that drafts with an EAGLE-1/2, EAGLE-3 or P-EAGLE head and its own KV cache.

Slot convention (models/heads, vLLM): head slot i holds token x[i+1] paired with the
target's feature of position i, sits at position i and predicts x[i+2]. After the target
has run x[0..n-1] and the next token x[n] is known, the committed slots are 0..n-1 and
slot n-1's logits give the first draft. Drafting appends slots to the head's KV; before
the next ``extend`` the cache is cropped back to the committed slots.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from eaglenest.models.decode.runner import StepOutput
from eaglenest.models.decode.sampling import SamplingParams, sample
from eaglenest.models.heads.base import AuxHead, ParallelHead, draft_head
from eaglenest.models.heads.layers import KV, causal_mask
from eaglenest.models.heads.registry import head_spec


class HeadDrafter:
    """Drafts for one request. ``head`` is any models.heads head (eval mode)."""

    def __init__(self, head: nn.Module) -> None:
        self.head = draft_head(head.eval())
        spec = head_spec(head)
        self.uses_aux = spec.uses_aux
        self.parallel = spec.parallel
        device = next(head.parameters()).device
        n_logits = self.head.lm_head.out_features
        # [draft_vocab] target id of each head logit (identity for EAGLE-1/2 heads)
        self.target_ids = self.head.to_target_ids(torch.arange(n_logits, device=device))
        self.vocab_size = int(self.head.cfg.vocab_size)
        self.device = device
        self.dtype = next(head.parameters()).dtype
        self.reset()

    def reset(self) -> None:
        self.past: KV | None = None
        self.slots = 0
        self.last_logits: torch.Tensor | None = None  # [draft_vocab] of the last slot
        self.last_out: torch.Tensor | None = None  # [1, 1, hidden] head output, last slot
        #: slots not yet run through the head (plain rounds defer them): (tokens, feats)
        self.backlog: list[tuple[list[int], torch.Tensor]] = []

    @property
    def has_context(self) -> bool:
        """Committed slots to draft from (the prompt has run through the head)."""
        return self.past is not None

    @property
    def aux_layer_ids(self) -> list[int]:
        return list(self.head.cfg.aux_layer_ids) if self.uses_aux else []

    # ---- committed context ---------------------------------------------------------------
    def features(self, out: StepOutput, rows: list[int] | slice) -> torch.Tensor:
        """[m, hidden] head input features for the chosen target rows."""
        return self.combine(self.inputs(out, rows))

    def inputs(self, out: StepOutput, rows: list[int] | slice) -> torch.Tensor:
        """What ``features`` is made of, before the head's combining layer: [m, 3 * hidden]
        aux-layer states (EAGLE-3, P-EAGLE) or [m, hidden] last hidden states."""
        src = out.aux if self.uses_aux else out.last_hidden
        assert src is not None
        return src[rows].to(self.device, self.dtype)

    def combine(self, inputs: torch.Tensor) -> torch.Tensor:
        """[m, in] ``inputs`` -> [m, hidden] features (identity for EAGLE-1/2 heads)."""
        return cast(AuxHead, self.head).combine(inputs) if self.uses_aux else inputs

    @torch.no_grad()
    def extend(self, tokens: list[int], feats: torch.Tensor) -> None:
        """Commit m new slots: tokens [m] (x[i+1]) with feats [m, hidden] (feature of i)."""
        self.crop()
        m = len(tokens)
        ids = torch.tensor([tokens], device=self.device)
        positions = torch.arange(self.slots, self.slots + m, device=self.device).unsqueeze(0)
        mask = causal_mask(m, self.slots, self.device)
        logits, out, self.past = self.head.step(ids, feats.unsqueeze(0), positions, mask, self.past)
        self.slots += m
        self.last_logits = logits[0, -1]
        self.last_out = out[:, -1:]

    def last(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [draft_vocab], head output [1, 1, hidden]) of the last committed slot."""
        assert self.last_logits is not None and self.last_out is not None, "extend() first"
        return self.last_logits, self.last_out

    def defer(self, tokens: list[int], inputs: torch.Tensor) -> None:
        """As ``extend``, but run later (``take_backlog``): a plain round drafts nothing, so
        its slots need not enter the head until the next drafting round. ``inputs`` as
        ``inputs()`` gives them: not even the combining layer runs until then."""
        self.backlog.append((list(tokens), inputs))

    def take_backlog(self) -> tuple[list[int], torch.Tensor] | None:
        """The deferred slots as one (tokens, features) to extend with, and forget them."""
        if not self.backlog:
            return None
        tokens = [t for chunk, _ in self.backlog for t in chunk]
        feats = self.combine(torch.cat([x for _, x in self.backlog]))  # [m, hidden]
        self.backlog = []
        return tokens, feats

    def crop(self) -> None:
        """Drop every draft slot, keeping the committed ones."""
        if self.past is not None and self.past[0].shape[2] > self.slots:
            self.past = (self.past[0][:, :, : self.slots], self.past[1][:, :, : self.slots])

    @torch.no_grad()
    def step(
        self,
        tokens: torch.Tensor,  # [q] target ids
        hidden: torch.Tensor,  # [1, q, hidden]
        positions: torch.Tensor,  # [q]
        mask: torch.Tensor,  # [q, past + q] bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A draft forward appended to the head KV: ([q, draft_vocab] logits, [1, q, h] out)."""
        logits, out, self.past = self.head.step(
            tokens.view(1, -1), hidden, positions.view(1, -1), mask, self.past
        )
        return logits[0], out

    # ---- drafting ------------------------------------------------------------------------
    def pick(
        self, logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None
    ) -> tuple[int, torch.Tensor | None]:
        """One draft from [draft_vocab] logits: (target id, q over the target vocab or None)."""
        if params.greedy:
            return int(self.target_ids[int(logits.argmax())]), None
        q_draft = torch.softmax(logits.float() / params.temperature, dim=-1)
        d = sample(q_draft, gen)
        q = torch.zeros(self.vocab_size, device=logits.device)
        q[self.target_ids] = q_draft  # draft id d <-> target id target_ids[d]
        return int(self.target_ids[d]), q

    @torch.no_grad()
    def draft_chain(
        self, k: int, params: SamplingParams, gen: torch.Generator | None
    ) -> tuple[list[int], torch.Tensor | None]:
        """k drafts one head step at a time: (target ids, q [k, vocab] or None if greedy).
        k = 0 (an adaptive plain round) drafts nothing: ([], None)."""
        assert self.last_logits is not None and self.last_out is not None
        self.crop()
        if k <= 0:
            return [], None
        drafts, qs = [], []
        logits, hidden = self.last_logits, self.last_out
        for j in range(k):
            token, q = self.pick(logits, params, gen)
            drafts.append(token)
            if q is not None:  # sampling: every pick has one
                qs.append(q)
            if j == k - 1:
                break
            pos = torch.tensor([self.slots + j], device=self.device)
            mask = causal_mask(1, self.slots + j, self.device)
            row, hidden = self.step(torch.tensor([token], device=self.device), hidden, pos, mask)
            logits = row[0]
        return drafts, None if params.greedy else torch.stack(qs)

    @torch.no_grad()
    def draft_parallel(
        self, k: int, params: SamplingParams, gen: torch.Generator | None
    ) -> tuple[list[int], torch.Tensor | None]:
        """P-EAGLE: k drafts from ONE forward over k - 1 mask slots after the committed ones.

        Draft 0 comes from the last committed slot; mask slot m (positions slots + m) yields
        draft m + 1 -- the layout of ``PEagleHead.draft_parallel`` (tested equal in
        tests/models/heads/test_peagle.py), here with the committed slots in the KV cache.
        """
        assert self.parallel and self.last_logits is not None
        self.crop()
        if k <= 0:
            return [], None
        rows = [self.last_logits]
        if k > 1:
            head = cast(ParallelHead, self.head)
            tokens, hidden = head.mask_slots(1, k - 1)  # [1, k-1], [1, k-1, hidden]
            pos = torch.arange(self.slots, self.slots + k - 1, device=self.device)
            mask = causal_mask(k - 1, self.slots, self.device)
            logits, _ = self.step(tokens[0], hidden, pos, mask)
            rows.extend(logits)
        picks = [self.pick(row, params, gen) for row in rows]
        drafts = [t for t, _ in picks]
        if params.greedy:
            return drafts, None
        return drafts, torch.stack([q for _, q in picks if q is not None])
