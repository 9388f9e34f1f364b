"""A direct batch-1 forward for dense pre-norm targets, over a preallocated KV cache.

transformers' decoder forward serves every use (batches, padding, generation utilities): a
``DynamicCache`` that concatenates each layer's whole cache at every forward, mask and
cache-position bookkeeping, kwargs plumbing through every module. A batch-1 decoding step
needs none of it. ``DirectDecoder`` runs the same modules (norms, projections, rotary
embedding, MLP or MoE block, lm_head: whatever linear kernels the chooser put in them,
sibling projections fused where the kernels made them one, models/decode/fusion.py) in a
loop that does only each layer's arithmetic, and writes keys into a ``KVBuffer`` in place.
Its outputs equal transformers' up to float rounding (tests/models/decode/test_direct.py;
benchmarks/round_profile.py times the two side by side).

Which targets: ``DIRECT_MODEL_TYPES``, the one registry (a model type whose decoder layer is
``x + attn(norm(x))``, ``x + mlp(norm(x))`` with rotary attention over all keys, optional
per-head q/k norms). Anything else (sliding windows, attention sinks, recurrent layers)
keeps transformers' forward (``direct_decoder`` returns None).
"""

from __future__ import annotations

from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own convention
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from eaglenest.models.decode.fusion import GATE_UP, QKV, fused_siblings
from eaglenest.models.heads.layers import apply_rope

DIRECT_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "qwen3_moe"})
MIN_CAPACITY = 256  # keys a fresh buffer holds before its first growth


class KVStore(Protocol):
    """Where the direct forward keeps keys: ``append`` takes a layer's new keys and values
    [B, kv_heads, q, dim] and returns all the keys and values its queries attend over."""

    def append(self, layer: int, key: torch.Tensor, value: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]: ...


def direct_decoder(model: nn.Module) -> DirectDecoder | None:
    """The direct forward of ``model``, or None where it runs transformers' own."""
    config: Any = model.config
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    inner = getattr(model, "model", None)
    if (config.model_type not in DIRECT_MODEL_TYPES or types != {"full_attention"}
            or inner is None or not hasattr(inner, "rotary_emb")):
        return None
    if len({p.device for p in model.parameters()}) > 1:  # layers spread over devices: the
        return None  # buffer keeps every layer's keys on one device
    return DirectDecoder(model)


class KVBuffer:
    """Keys and values of every layer, preallocated: ``keys[layer]`` is
    [1, kv_heads, capacity, dim], one tensor per layer.

    Slots 0..length-1 hold the committed tokens; a forward writes its q new tokens into
    slots length..length+q-1. A full layer grows by half (at least to what the forward
    needs), one layer at a time, so growing never holds two copies of the whole cache.
    Dropping uncommitted tokens is only moving ``length``; ``keep`` moves the kept new
    rows down.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (1, kv_heads, MIN_CAPACITY, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.length = 0  # committed slots

    def _reserve(self, layer: int, total: int) -> None:
        """Room for ``total`` slots in ``layer`` (its committed slots carried over)."""
        cap = self.keys[layer].shape[2]
        if total <= cap:
            return
        cap = max(total, cap + cap // 2)
        for bufs in (self.keys, self.values):
            old = bufs[layer]
            new = old.new_empty(old.shape[0], old.shape[1], cap, old.shape[3])
            new[:, :, : self.length] = old[:, :, : self.length]
            bufs[layer] = new

    def append(self, layer: int, key: torch.Tensor, value: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a forward's q new keys/values [1, kv_heads, q, dim] of ``layer`` at slots
        length..length+q-1 (uncommitted); returns the layer's keys and values up to them
        ([1, kv_heads, length + q, dim] views)."""
        n, q = self.length, key.shape[2]
        self._reserve(layer, n + q)
        keys, values = self.keys[layer], self.values[layer]  # [1, kv_heads, capacity, dim]
        keys[:, :, n : n + q] = key
        values[:, :, n : n + q] = value
        return keys[:, :, : n + q], values[:, :, : n + q]

    def keep(self, indices: list[int]) -> None:
        """Commit the new tokens at ``indices`` (ascending) of the last forward.

        Example length=4, the forward wrote slots 4..8, indices [0, 2, 3] -> slots 4, 6, 7
        move to 4, 5, 6 and length becomes 7 (slots 0..3 are not touched).
        """
        n, m = self.length, len(indices)
        if indices != list(range(m)):
            rows = torch.tensor(indices, device=self.keys[0].device) + n
            for buf in (*self.keys, *self.values):
                buf[:, :, n : n + m] = buf.index_select(2, rows)  # gathers before writing
        self.length = n + m


class CacheStore:
    """A transformers ``DynamicCache`` (every layer a ``DynamicLayer``) as the direct
    forward's key store: ``append`` concatenates, as transformers' forward would (the batch
    engine's padded rows, models/decode/batch_kv.py)."""

    def __init__(self, cache: DynamicCache) -> None:
        self.cache = cache

    def append(self, layer: int, key: torch.Tensor, value: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        return cast(DynamicLayer, self.cache.layers[layer]).update(key, value)


class DirectDecoder:
    """Forward of a transformers causal LM's own modules over a ``KVStore``: a request's
    ``KVBuffer`` (batch 1) or the batch engine's padded rows (``CacheStore``)."""

    def __init__(self, model: Any) -> None:  # a transformers causal LM of DIRECT_MODEL_TYPES
        self.model = model
        self.inner: Any = model.model  # embed_tokens, layers, norm, rotary_emb
        config: Any = model.config
        attn = self.inner.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.scaling = float(attn.scaling)
        self.lm_head: Any = model.get_output_embeddings()

    def new_buffer(self) -> KVBuffer:
        param = next(self.model.parameters())
        return KVBuffer(len(self.inner.layers), self.kv_heads, self.head_dim, param.dtype,
                        param.device)

    @torch.no_grad()
    def forward(
        self,
        kv: KVStore,
        ids: torch.Tensor,  # [B, q] new token ids
        positions: torch.Tensor,  # [B, q] their positions
        mask: torch.Tensor | None,  # [B or 1, 1, q, keys] additive or bool; None: all keys
        aux_layer_ids: list[int],
        last_logits_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(logits [B, q or 1, vocab] float32, final-norm hidden [B, q, hidden], inputs of
        the aux layers [B, q, n_aux * hidden] or None), as ``runner.model_forward``. Appends
        the q new keys to ``kv`` (uncommitted)."""
        x = self.inner.embed_tokens(ids)  # [B, q, hidden]
        cos, sin = self.inner.rotary_emb(x, positions)  # [B, q, head_dim] each
        grabbed: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.inner.layers):
            if i in aux_layer_ids:
                grabbed[i] = x
            x = x + self._attention(layer.self_attn, layer.input_layernorm(x), kv, i, cos, sin,
                                    mask)
            x = x + _mlp_forward(layer.mlp, layer.post_attention_layernorm(x))
        last = self.inner.norm(x)  # [B, q, hidden]
        logits = self.lm_head(last[:, -1:] if last_logits_only else last).float()
        aux = torch.cat([grabbed[k] for k in aux_layer_ids], dim=-1) if aux_layer_ids else None
        return logits, last, aux

    def _attention(self, attn: Any, h: torch.Tensor, kv: KVStore, layer: int,
                   cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None
                   ) -> torch.Tensor:  # [B, q, hidden] -> [B, q, hidden]
        b, q, d = h.shape[0], h.shape[1], self.head_dim
        fused = fused_siblings(attn, QKV)
        projected = fused.split(h) if fused is not None else [getattr(attn, p)(h) for p in QKV]
        query = projected[0].view(b, q, self.heads, d)  # [B, q, heads, dim]
        key = projected[1].view(b, q, self.kv_heads, d)
        value = projected[2].view(b, q, self.kv_heads, d)
        if hasattr(attn, "q_norm"):  # Qwen3: RMS norm per head before the rotation
            query, key = attn.q_norm(query), attn.k_norm(key)
        query = apply_rope(query.transpose(1, 2), cos, sin)  # [B, heads, q, dim]
        key = apply_rope(key.transpose(1, 2), cos, sin)  # [B, kv_heads, q, dim]
        keys, values = kv.append(layer, key, value.transpose(1, 2))  # [B, kv_heads, keys, dim]
        out = F.scaled_dot_product_attention(
            query, keys, values, attn_mask=mask, scale=self.scaling,
            enable_gqa=self.heads != self.kv_heads,
        )  # [B, heads, q, dim]
        return attn.o_proj(out.transpose(1, 2).reshape(b, q, self.heads * d))


def _mlp_forward(mlp: Any, h: torch.Tensor) -> torch.Tensor:  # [B, q, hidden] -> same
    """``mlp(h)``; a gated MLP whose gate/up run fused computes them in one product."""
    fused = fused_siblings(mlp, GATE_UP)
    if fused is None:
        return mlp(h)
    gate, up = fused.split(h)  # [B, q, intermediate] each
    return mlp.down_proj(mlp.act_fn(gate) * up)
