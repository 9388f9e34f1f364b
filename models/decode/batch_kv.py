"""Several requests' target KV caches as rows of one padded DynamicCache (continuous batching).

Layout: every layer's keys/values are [B, kv_heads, W, head_dim]; row b is one request.
Columns are *not* contiguous per request: ``valid[b, c]`` says whether column c holds one of
row b's committed tokens and ``key_pos[b, c]`` is that token's position (keys are stored
after RoPE, so attention does not care where a key sits, only whether the mask lets a
query see it). Each forward appends the same number q of columns to every row (short rows
padded); verification then marks the kept columns valid and leaves the rejected ones as
holes. Holes and padding are masked out; ``compact`` gathers the valid columns of every row
to the left when the waste passes ``slack`` columns.

Worked example: rows A (3 tokens) and B (1 token) after joining, W = 3:
    valid = [[1, 1, 1], [1, 0, 0]]
  a chain forward of q = 3 per row appends columns 3..5; A keeps new tokens [0, 1], B keeps
  [0] -> valid = [[1, 1, 1, 1, 1, 0], [1, 0, 0, 1, 0, 0]] (lengths 5 and 2); compact ->
    valid = [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], B's keys gathered from columns [0, 3].

Targets with recurrent (linear-attention) layers cannot drop rejected tokens this way:
they are not supported here (the engine serves them one request at a time).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from eaglenest.models.decode.direct import CacheStore, direct_decoder
from eaglenest.models.decode.runner import layer_kv, model_forward


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, q, k] bool -> [B, 1, q, k] additive mask (0 allowed, dtype-min elsewhere)."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    neg = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, neg)[:, None]


class BatchKV:
    """Rows of committed target KV for the active requests; see the module docstring."""

    def __init__(self, model: nn.Module, aux_layer_ids: list[int], slack: int = 32,
                 direct: bool = True) -> None:
        """``direct``: run the target's direct forward (models/decode/direct.py) over the
        rows where it has one; False: transformers' forward."""
        self.model, self.aux_layer_ids, self.slack = model, list(aux_layer_ids), slack
        self.direct = direct_decoder(model) if direct else None
        config = model.config
        self.layer_types = list(getattr(config, "layer_types", None) or ["full_attention"])
        if "linear_attention" in self.layer_types:
            raise ValueError("batched decoding needs an attention-only target")
        self.sliding_window = getattr(config, "sliding_window", None)
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.cache: DynamicCache | None = None
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=self.device)  # [B, W]
        self.key_pos = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # [B, W]
        self.lengths: list[int] = []  # committed tokens per row (= next position)
        self._block = 0  # first column of the last forward's new tokens

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        return int(self.valid.shape[1])

    def _layers(self) -> list[DynamicLayer]:
        assert self.cache is not None
        return [cast(DynamicLayer, layer) for layer in self.cache.layers]  # add() admits no other

    # ---- joining and leaving ---------------------------------------------------------
    def add(self, cache: DynamicCache, length: int) -> None:
        """Append a row from a batch-1 (prefill) cache holding exactly ``length`` keys."""
        for layer in cache.layers:
            if type(layer) is not DynamicLayer or layer_kv(layer)[0].shape[2] != length:
                raise ValueError("expected full attention layers holding the prompt's keys")
        incoming = [cast(DynamicLayer, layer) for layer in cache.layers]  # checked above
        row_valid = torch.ones(1, length, dtype=torch.bool, device=self.device)
        row_pos = torch.arange(length, device=self.device)[None]
        if self.cache is None:
            self.cache, self.valid, self.key_pos = cache, row_valid, row_pos
            self.lengths = [length]
            return
        width = max(self.width, length)
        for mine, theirs in zip(self._layers(), incoming, strict=True):
            (keys, values), (new_keys, new_values) = layer_kv(mine), layer_kv(theirs)
            mine.keys = torch.cat([_pad(keys, width), _pad(new_keys, width)])
            mine.values = torch.cat([_pad(values, width), _pad(new_values, width)])
        self.valid = torch.cat([_pad_cols(self.valid, width), _pad_cols(row_valid, width)])
        self.key_pos = torch.cat([_pad_cols(self.key_pos, width), _pad_cols(row_pos, width)])
        self.lengths.append(length)

    def remove(self, rows: list[int]) -> None:
        """Drop the given rows (finished or cancelled requests); the others keep their order."""
        keep = [b for b in range(self.rows) if b not in set(rows)]
        if not keep:
            self.cache, self.lengths = None, []
            self.valid, self.key_pos = self.valid[:0, :0], self.key_pos[:0, :0]
            return
        index = torch.tensor(keep, device=self.device)
        for layer in self._layers():
            keys, values = layer_kv(layer)
            layer.keys = keys.index_select(0, index.to(keys.device))
            layer.values = values.index_select(0, index.to(values.device))
        self.valid, self.key_pos = self.valid[index], self.key_pos[index]
        self.lengths = [self.lengths[b] for b in keep]
        self.compact_if_wasteful()

    # ---- one step ----------------------------------------------------------------------
    @torch.no_grad()
    def forward(
        self,
        tokens: list[list[int]],  # per row: new token ids [q_b]
        depths: list[list[int]],  # per row: position offsets from the row's length [q_b]
        local: list[torch.Tensor],  # per row: [q_b, q_b] bool, new token i may see new j
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One target forward for all rows, padded to q = max q_b: (logits [B, q, vocab],
        hidden [B, q, h], aux [B, q, n_aux * h] or None). Rows b's outputs are [b, :q_b]."""
        self.compact_if_wasteful()
        n_rows, q = self.rows, max(len(t) for t in tokens)
        ids = torch.zeros(n_rows, q, dtype=torch.long)
        pos = torch.zeros(n_rows, q, dtype=torch.long)
        block = torch.eye(q, dtype=torch.bool).repeat(n_rows, 1, 1)  # pads see themselves
        for b in range(n_rows):
            n = len(tokens[b])
            ids[b, :n] = torch.tensor(tokens[b])
            pos[b] = self.lengths[b] + torch.arange(q)
            pos[b, :n] = self.lengths[b] + torch.tensor(depths[b])
            block[b, :n, :n] = local[b]
        ids, pos, block = ids.to(self.device), pos.to(self.device), block.to(self.device)
        mask = self._mask(pos, block)
        assert self.cache is not None
        if self.direct is not None:
            assert not isinstance(mask, dict)  # direct targets attend over all keys
            out = self.direct.forward(CacheStore(self.cache), ids, pos, mask, self.aux_layer_ids)
        else:
            out = model_forward(self.model, ids, pos, mask, self.cache, self.aux_layer_ids)
        self._block = self.width
        self.valid = torch.cat([self.valid, torch.zeros_like(block[:, 0])], dim=1)
        self.key_pos = torch.cat([self.key_pos, pos], dim=1)
        return out

    def _mask(
        self, pos: torch.Tensor, block: torch.Tensor
    ) -> torch.Tensor | dict[str, torch.Tensor | None]:
        """[B, 1, q, W + q] additive masks: the row's valid columns, then the new block.

        Example row valid [1, 0, 1], chain block of 2 -> rows [1, 0, 1, 1, 0] and
        [1, 0, 1, 1, 1]. Sliding layers also need key_pos > query_pos - window.
        """
        n_rows, q = pos.shape
        past = self.valid[:, None, :].expand(n_rows, q, self.width)
        allowed = torch.cat([past, block], dim=2)  # [B, q, W + q]
        full = _additive(allowed, self.dtype)
        if set(self.layer_types) == {"full_attention"}:
            return full
        masks: dict[str, torch.Tensor | None] = {"full_attention": full}
        if self.sliding_window:
            keys = torch.cat([self.key_pos, pos], dim=1)  # [B, W + q]
            window = keys[:, None, :] > pos[:, :, None] - int(self.sliding_window)
            masks["sliding_attention"] = _additive(allowed & window, self.dtype)
        return masks

    def commit(self, row: int, kept: list[int]) -> None:
        """Keep the new tokens ``kept`` (indices into row's block of the last forward)."""
        cols = torch.tensor(kept, device=self.device) + self._block
        self.valid[row, cols] = True
        self.lengths[row] += len(kept)

    # ---- housekeeping ------------------------------------------------------------------
    def compact_if_wasteful(self) -> None:
        if self.rows and self.width > max(self.lengths) + self.slack:
            self.compact()

    def compact(self) -> None:
        """Gather every row's valid columns to the left; width becomes max(lengths).

        Example valid [[1, 0, 1, 1], [0, 1, 0, 0]] -> index [[0, 2, 3], [1, 0, 0]] (pads
        point at column 0, masked), valid [[1, 1, 1], [1, 0, 0]].
        """
        counts = self.valid.sum(1)  # [B]
        width = int(counts.max())
        # stable sort puts valid columns first, in order: the first `count` of each row
        order = torch.sort((~self.valid).to(torch.int8), dim=1, stable=True).indices
        index = order[:, :width]  # [B, width]
        fresh = torch.arange(width, device=self.device)[None] < counts[:, None]
        index = torch.where(fresh, index, torch.zeros_like(index))
        for layer in self._layers():
            keys, values = layer_kv(layer)
            heads, dim = keys.shape[1], keys.shape[3]
            idx = index[:, None, :, None].expand(-1, heads, -1, dim).to(keys.device)
            layer.keys = keys.gather(2, idx)
            layer.values = values.gather(2, idx)
        self.key_pos = self.key_pos.gather(1, index)
        self.valid = fresh


def _pad(x: torch.Tensor, width: int) -> torch.Tensor:
    """[B, H, W, D] -> [B, H, width, D] with zero columns on the right."""
    return F.pad(x, (0, 0, 0, width - x.shape[2]))


def _pad_cols(x: torch.Tensor, width: int) -> torch.Tensor:
    """[B, W] -> [B, width] padded with zeros / False (padding is never valid)."""
    extra = x.new_zeros(x.shape[0], width - x.shape[1])
    return torch.cat([x, extra], dim=1)
