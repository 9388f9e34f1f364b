"""KV-cached target forwards for any causal LM in the architecture table.

``TargetRunner`` owns one request's target KV cache and runs forwards over new tokens at
explicit positions, returning logits, the final-norm hidden state (EAGLE-1/2 features) and
the residual stream entering the aux layers (EAGLE-3 / P-EAGLE features).

Two forwards: for the dense targets of ``direct.DIRECT_MODEL_TYPES`` the runner runs
``direct.DirectDecoder`` over a preallocated ``KVBuffer`` (no per-step cache copies, none
of transformers' mask and cache bookkeeping); every other target (or ``direct=False``) runs
transformers' forward over a ``DynamicCache``. Both give the same outputs up to float
rounding.

Cache layout: the cache always holds the committed tokens 0..length-1 contiguously (one key
per token, positions 0..length-1). Sliding-window layers (GPT-OSS) are given a full
``DynamicLayer`` so that every layer has the same key axis; the window is applied through
the mask instead. A verification forward appends keys for the new tokens; afterwards
``keep(indices)`` gathers the accepted ones back into place and drops the rest.

Targets with linear-attention (recurrent) layers (Qwen3-Next) cannot drop a suffix of
their recurrent state: the runner snapshots those layers before each verification and, when
some tokens are rejected, restores the snapshot and replays the accepted tokens.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import (
    CacheLayerMixin,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionCacheLayerMixin,
)

from eaglenest.models.decode.direct import DirectDecoder, KVBuffer, direct_decoder
from eaglenest.models.decode.masks import additive_mask, sliding_mask
from eaglenest.models.heads.layers import causal_mask

CacheLayer = CacheLayerMixin | LinearAttentionCacheLayerMixin


def layer_kv(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """A filled layer's keys and values (transformers types them Optional: a layer has none
    before its first update; the layers handled here have run the prompt)."""
    assert layer.keys is not None and layer.values is not None
    return layer.keys, layer.values


@dataclass
class StepOutput:
    logits: torch.Tensor  # [q, vocab] float32
    last_hidden: torch.Tensor  # [q, hidden] after the final norm (EAGLE-1/2 feature)
    aux: torch.Tensor | None  # [q, n_aux * hidden] inputs of the aux layers (EAGLE-3)


class TargetRunner:
    """One request's KV cache over a transformers causal LM (batch 1)."""

    def __init__(self, model: nn.Module, aux_layer_ids: list[int] | None = None,
                 direct: bool = True) -> None:
        """``direct``: use the direct forward where the target has one (False: always
        transformers' forward, the reference the direct one is tested against)."""
        self.model = model
        self.direct: DirectDecoder | None = direct_decoder(model) if direct else None
        self.config: Any = model.config  # the transformers config of the architecture
        self.aux_layer_ids = list(aux_layer_ids or [])
        self.layer_types: list[str] = list(
            getattr(self.config, "layer_types", None) or ["full_attention"]
        )
        self.sliding_window = getattr(self.config, "sliding_window", None)
        self.recurrent = "linear_attention" in self.layer_types
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.cache: DynamicCache = self._new_cache()
        self.kv: KVBuffer | None = None if self.direct is None else self.direct.new_buffer()
        self.length = 0  # committed tokens held in the cache
        self._snapshot: dict[int, CacheLayer] = {}

    # ---- cache management ------------------------------------------------------------
    def dynamic_cache(self) -> DynamicCache:
        """The committed tokens' keys as a transformers cache (the batch engine takes a
        prefilled request's keys this way); the runner's own cache where it has one."""
        if self.kv is None:
            return self.cache
        cache = self._new_cache()
        for i, layer in enumerate(cache.layers):
            keys = self.kv.keys[i][:, :, : self.length].clone()  # [1, kv_heads, length, dim]
            assert isinstance(layer, DynamicLayer)  # direct targets have no other layers
            layer.update(keys, self.kv.values[i][:, :, : self.length].clone())
        return cache

    def _new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.config)
        for i, layer in enumerate(cache.layers):
            if type(layer) is DynamicSlidingWindowLayer:
                cache.layers[i] = DynamicLayer()  # full keys; the window lives in the mask
        return cache

    def reset(self) -> None:
        self.cache = self._new_cache()
        self.kv = None if self.direct is None else self.direct.new_buffer()
        self.length = 0
        self._snapshot = {}

    def _attention_layers(self) -> list[DynamicLayer]:
        return [
            layer
            for layer in self.cache.layers
            if isinstance(layer, DynamicLayer)
            and layer.keys is not None
            and layer.keys.dim() == 4
        ]

    def _recurrent_layers(self) -> dict[int, CacheLayer]:
        return {
            i: layer
            for i, layer in enumerate(self.cache.layers)
            if hasattr(layer, "recurrent_states") or hasattr(layer, "conv_states")
        }

    # ---- forwards ----------------------------------------------------------------------
    @torch.no_grad()
    def forward(
        self,
        tokens: list[int] | torch.Tensor,  # [q] new token ids
        depths: torch.Tensor | None = None,  # [q] offsets from self.length (tree); None: 0..q-1
        tree: torch.Tensor | None = None,  # [q, q] bool: new token i may see new token j
        last_logits_only: bool = False,
    ) -> StepOutput:
        """Run the new tokens at positions length + depth; their keys are appended (not
        committed: call ``commit`` / ``keep`` afterwards). ``last_logits_only``: logits of
        the last token only ([1, vocab]; a prefill needs no more), hidden states of all."""
        ids = torch.as_tensor(tokens, dtype=torch.long, device=self.device).view(1, -1)
        q = ids.shape[1]
        if depths is None:
            depths = torch.arange(q, device=self.device)
        positions = (self.length + depths.to(self.device)).view(1, -1)
        if self.recurrent:
            self._snapshot = copy.deepcopy(self._recurrent_layers())
        mask = None if tree is None else self._mask(positions[0], tree)
        if self.direct is not None and self.kv is not None:
            self.kv.length = self.length
            assert not isinstance(mask, dict)  # direct targets attend over all keys
            if mask is None and q > 1:  # new token i sees the cache and new tokens 0..i
                mask = causal_mask(q, self.length, self.device)
            logits, last, aux = self.direct.forward(
                self.kv, ids, positions, mask, self.aux_layer_ids, last_logits_only
            )
        else:
            logits, last, aux = model_forward(
                self.model, ids, positions, mask, self.cache, self.aux_layer_ids,
                last_logits_only,
            )
        first_aux = None if aux is None else aux[0]
        return StepOutput(logits=logits[0], last_hidden=last[0], aux=first_aux)

    def _mask(
        self, positions: torch.Tensor, tree: torch.Tensor
    ) -> torch.Tensor | dict[str, torch.Tensor | None]:
        """Additive 4-D mask(s) [1, 1, q, length + q] for a tree forward.

        Cached keys are all visible (they are the committed prefix); among the new tokens
        the tree decides. Example length=2, tree=[[1,0,0],[1,1,0],[1,0,1]] (token 2 is a
        sibling of token 1):
            [[1, 1, 1, 0, 0],
             [1, 1, 1, 1, 0],
             [1, 1, 1, 0, 1]]
        """
        q = tree.shape[0]
        past = torch.ones(q, self.length, dtype=torch.bool, device=self.device)
        full = torch.cat([past, tree.to(self.device)], dim=1)  # [q, length + q]
        full_mask = additive_mask(full, self.dtype)
        masks: dict[str, torch.Tensor | None] = {"full_attention": full_mask}
        if self.layer_types == ["full_attention"] or set(self.layer_types) == {"full_attention"}:
            return full_mask
        if self.sliding_window:
            key_pos = torch.cat([torch.arange(self.length, device=self.device), positions])
            window = sliding_mask(positions, key_pos, int(self.sliding_window))
            masks["sliding_attention"] = additive_mask(full & window, self.dtype)
        masks["linear_attention"] = None
        return masks

    # ---- after verification --------------------------------------------------------------
    def commit(self, new_tokens: list[int], accepted: int) -> None:
        """Keep the first ``accepted`` of the ``len(new_tokens)`` tokens just run (chain)."""
        q = len(new_tokens)
        if accepted == q:
            self.length += q
            self._snapshot = {}
            return
        if self.recurrent:  # roll the recurrent state back, then replay the kept tokens
            self._truncate(self.length)
            self._restore()
            if accepted:
                self.forward(new_tokens[:accepted], last_logits_only=True)
        else:
            self._truncate(self.length + accepted)
        self.length += accepted
        self._snapshot = {}

    def keep(self, indices: list[int]) -> None:
        """Keep the new tokens at ``indices`` (ascending, into the last forward's tokens).

        Example length=4, last forward appended 5 keys (cache positions 4..8), indices
        [0, 2, 3] -> cache keeps rows [0, 1, 2, 3, 4, 6, 7] and length becomes 7.
        """
        if self.recurrent:
            raise RuntimeError("tree KV gathering needs an attention-only target")
        if self.kv is not None:
            self.kv.length = self.length
            self.kv.keep(indices)
            self.length += len(indices)
            return
        rows = torch.tensor(list(range(self.length)) + [self.length + i for i in indices])
        for layer in self._attention_layers():
            keys, values = layer_kv(layer)
            rows_d = rows.to(keys.device)
            layer.keys = keys.index_select(2, rows_d)  # [1, kv_heads, kept, head_dim]
            layer.values = values.index_select(2, rows_d)
        self.length += len(indices)

    def _truncate(self, length: int) -> None:
        for layer in self._attention_layers():
            keys, values = layer_kv(layer)
            layer.keys = keys[:, :, :length]
            layer.values = values[:, :, :length]

    def _restore(self) -> None:
        for i, layer in self._snapshot.items():
            self.cache.layers[i] = layer
        self._snapshot = {}


@torch.no_grad()
def model_forward(
    model: Any,  # a transformers causal LM (model.model.layers differ by architecture)
    ids: torch.Tensor,  # [B, q] new token ids
    positions: torch.Tensor,  # [B, q] their positions
    mask: torch.Tensor | dict[str, torch.Tensor | None] | None,  # [B, 1, q, keys] or per type
    cache: DynamicCache,
    aux_layer_ids: list[int],
    last_logits_only: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One KV-cached forward of a causal LM: (logits [B, q, vocab] float32, or [B, 1, vocab]
    for the last token with ``last_logits_only``; final-norm hidden [B, q, hidden]; aux-layer
    inputs [B, q, n_aux * hidden] or None). Appends q keys."""
    grabbed: dict[int, torch.Tensor] = {}
    hooks = [
        model.model.layers[k].register_forward_pre_hook(_grab(grabbed, k), with_kwargs=True)
        for k in set(aux_layer_ids)
    ]
    try:
        out = model.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
    finally:
        for h in hooks:
            h.remove()
    last = out.last_hidden_state  # [B, q, hidden]
    logits = model.get_output_embeddings()(last[:, -1:] if last_logits_only else last).float()
    aux = None
    if aux_layer_ids:
        aux = torch.cat([grabbed[k] for k in aux_layer_ids], dim=-1)
    return logits, last, aux


def _grab(store: dict[int, torch.Tensor], k: int):  # noqa: ANN202 - hook factory
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        store[k] = (args[0] if args else kwargs["hidden_states"]).detach()

    return hook
