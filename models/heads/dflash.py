"""DFlash draft head: one non-causal forward drafts a whole block (arXiv 2602.06036).

Structure (vLLM's ``DFlashQwen3Model``; the parameter names are what its loader maps):

    fc:          Linear(n_aux * h -> h)        fuses the target's aux states (``combine``)
    hidden_norm: RMSNorm(h) on fc's output     the "context states" c
    layers.i:    Qwen3 decoder layers: input_layernorm, self_attn.{q,k,v,o}_proj with
                 per-head q_norm / k_norm (before RoPE), post_attention_layernorm, mlp
    norm:        final RMSNorm;  lm_head: Linear(h -> draft_vocab);  d2t / t2d as EAGLE-3's
    embed_tokens: the target's embeddings, frozen and not saved (vLLM shares the target's)

Context: for positions 0..n-1 whose target aux states exist, layer l's keys/values are
``k_norm(k_proj_l(c))`` (RoPE at the context positions) and ``v_proj_l(c)`` -- the same c
feeds every layer, only the projections differ; c never runs through the layers.

Block: query slots [x_n, MASK, ..., MASK] at positions n..n+B-1 (x_n: the target's newest
token, whose own aux state is not known yet; MASK: ``mask_token_id`` embedded by the frozen
target embedding). Every layer is a pre-norm Qwen3 layer whose keys/values are [the
context's ; the block's own], non-causal inside the block. Slot j >= 1 predicts x_{n+j}
(masked-token prediction); slot 0's output is unused, so a forward proposes B - 1 drafts.

Training (``loss``): random anchors a per sequence, one block per anchor over the context
0..a-1 (``block_mask``), decay-weighted soft cross-entropy against the target's
distribution (models/heads/dflash_train.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from eaglenest.models.heads.base import HeadBatch, HeadLoss, Partition, mask_token_for
from eaglenest.models.heads.dflash_train import block_loss
from eaglenest.models.heads.layers import (
    KV,
    DraftMLP,
    HeadConfig,
    RMSNorm,
    apply_rope,
    grouped_attention,
    rope_cos_sin,
)
from eaglenest.models.heads.vocab import DraftVocabHead, draft_vocab_for
from eaglenest.models.target import Capture
from eaglenest.models.training.config import TrainConfig

if TYPE_CHECKING:
    from eaglenest.models.data.template import Sample
    from eaglenest.models.target import Target

MAX_LAYERS = 8


class DFlashAttention(nn.Module):
    """Qwen3 attention whose keys/values are a given context's plus the queries' own."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, hd, bias = cfg.hidden_size, cfg.head_dim, cfg.attention_bias
        self.q_proj = nn.Linear(h, cfg.num_attention_heads * hd, bias=bias)
        self.k_proj = nn.Linear(h, cfg.num_key_value_heads * hd, bias=bias)
        self.v_proj = nn.Linear(h, cfg.num_key_value_heads * hd, bias=bias)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, h, bias=bias)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def _heads(self, x: torch.Tensor, proj: nn.Linear, n: int) -> torch.Tensor:
        """[batch, seq, h] -> [batch, n, seq, head_dim]."""
        b, s, _ = x.shape
        return proj(x).view(b, s, n, self.cfg.head_dim).transpose(1, 2)

    def project_kv(self, x: torch.Tensor, positions: torch.Tensor) -> KV:
        """Keys (k_norm, then RoPE at ``positions`` [batch, seq]) and values of ``x``
        [batch, seq, h]: [batch, kv_heads, seq, head_dim] each."""
        nkv = self.cfg.num_key_value_heads
        k = self.k_norm(self._heads(x, self.k_proj, nkv))
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, k.dtype)
        return apply_rope(k, cos, sin), self._heads(x, self.v_proj, nkv)

    def forward(
        self,
        x: torch.Tensor,  # [batch, q, h] (input-normed block states)
        positions: torch.Tensor,  # [batch, q] long
        ctx: KV,  # [batch, kv_heads, n, head_dim] each
        mask: torch.Tensor,  # [batch or 1, q, n + q] bool, True = attend
    ) -> torch.Tensor:
        b, s, _ = x.shape
        cfg = self.cfg
        q = self.q_norm(self._heads(x, self.q_proj, cfg.num_attention_heads))
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, q.dtype)
        k, v = self.project_kv(x, positions)
        keys = torch.cat([ctx[0].to(k.dtype), k], dim=2)  # [batch, kv_heads, n + q, d]
        values = torch.cat([ctx[1].to(v.dtype), v], dim=2)
        out = grouped_attention(apply_rope(q, cos, sin), keys, values, mask)
        width = cfg.num_attention_heads * cfg.head_dim  # explicit: s may be 0 (no anchor)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, width))


class DFlashLayer(nn.Module):
    """A pre-norm Qwen3 decoder layer attending to [context ; block]."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx: KV,
                mask: torch.Tensor) -> torch.Tensor:  # x: [batch, q, h]
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashHead(DraftVocabHead):
    """DFlash head. ``d2t``/``t2d`` as EAGLE-3's (identity offsets / all-True for a head
    over the target's whole vocabulary, e.g. a public checkpoint without its own lm_head)."""

    def __init__(self, cfg: HeadConfig, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        super().__init__()
        _check_config(cfg)
        assert cfg.draft_vocab_size is not None and cfg.mask_token_id is not None
        if d2t.shape != (cfg.draft_vocab_size,) or t2d.shape != (cfg.vocab_size,):
            raise ValueError("d2t must be [draft_vocab_size] and t2d [vocab_size]")
        self.cfg = cfg
        self.mask_token_id: int = cfg.mask_token_id
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(len(cfg.aux_layer_ids) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashLayer(cfg) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", d2t.long().clone())
        self.register_buffer("t2d", t2d.bool().clone())

    # ---- pieces used by training and by decoding -------------------------------------
    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """[..., n_aux * h] target aux states -> [..., h] (vLLM combine_hidden_states)."""
        return self.fc(aux)

    def context_kv(self, aux: torch.Tensor, positions: torch.Tensor) -> list[KV]:
        """Each layer's context keys/values (RoPE applied) from the target's aux states
        ``aux`` [batch, n, n_aux * h] at ``positions`` [batch, n]: per layer, keys and
        values [batch, kv_heads, n, head_dim]. A decoder appends later positions' along
        dim 2 (they depend on their own position only)."""
        c = self.hidden_norm(self.combine(aux))  # [batch, n, h]
        return [cast(DFlashLayer, layer).self_attn.project_kv(c, positions)
                for layer in self.layers]

    def block_logits(
        self,
        tokens: torch.Tensor,  # [batch, q] target ids of the query slots
        positions: torch.Tensor,  # [batch, q] long
        ctx: list[KV],  # per layer: [batch, kv_heads, n, head_dim] each
        mask: torch.Tensor,  # [batch or 1, q, n + q] bool, True = attend
    ) -> torch.Tensor:
        """Head-vocabulary logits [batch, q, draft_vocab] of every query slot."""
        x = self.embed_tokens(tokens)  # [batch, q, h]
        for layer, layer_ctx in zip(self.layers, ctx, strict=True):
            x = layer(x, positions, layer_ctx, mask)
        return self.lm_head(self.norm(x))

    def block_tokens(self, anchor: torch.Tensor, block_len: int) -> torch.Tensor:
        """[batch, block_len]: each row's anchor (``anchor`` [batch, 1]) then mask tokens."""
        masks = anchor.new_full((anchor.shape[0], block_len - 1), self.mask_token_id)
        return torch.cat([anchor, masks], dim=1)

    def draft_block(
        self,
        anchor: torch.Tensor,  # [batch, 1] target id of the newest token x_n
        position: torch.Tensor,  # [batch] long: the anchor's position n
        ctx: list[KV],  # context_kv of positions before n: [batch, kv_heads, n, d] each
        block_len: int,
        ctx_mask: torch.Tensor | None = None,  # [batch, n] bool: real context keys
    ) -> torch.Tensor:
        """Logits [batch, block_len - 1, draft_vocab] of slots 1..block_len-1 (slot j
        drafts x_{n+j}) from ONE forward of [anchor, MASK x (block_len - 1)] at positions
        n..n+block_len-1. Rows whose context is shorter than n mark the rest False in
        ``ctx_mask``; the block sees its own slots and the context only."""
        b, n = anchor.shape[0], ctx[0][0].shape[2]
        offsets = torch.arange(block_len, device=anchor.device)
        positions = position.view(b, 1) + offsets  # [batch, block_len]
        seen = ctx_mask if ctx_mask is not None else torch.ones(
            b, n, dtype=torch.bool, device=anchor.device)
        mask = torch.cat([seen.unsqueeze(1).expand(b, block_len, n),
                          seen.new_ones(b, block_len, block_len)], dim=2)
        logits = self.block_logits(self.block_tokens(anchor, block_len), positions, ctx, mask)
        return logits[:, 1:]

    # ---- training ----------------------------------------------------------------------
    def loss(
        self,
        batch: HeadBatch,
        cap: Capture,
        block_size: int = 8,
        gamma: float = 4.0,
        anchors: int = 32,
        variable_prefix: bool = False,
        partition: Partition | None = None,
    ) -> HeadLoss:
        """Decay-weighted block loss over random anchors (models/heads/dflash_train.py)."""
        return block_loss(self, batch, cap, block_size, gamma, anchors, variable_prefix,
                          partition)

    @torch.no_grad()
    def draft(self, tokens: torch.Tensor, aux: torch.Tensor, k: int) -> torch.Tensor:
        """k greedy drafts (target ids, [k]) after ``tokens`` [1, n + 1] (context x[0..n-1]
        plus the target's next token x_n), from aux states ``aux`` [1, n, n_aux * h]."""
        n = aux.shape[1]
        ctx = self.context_kv(aux, torch.arange(n, device=aux.device).unsqueeze(0))
        position = torch.tensor([n], device=aux.device)
        logits = self.draft_block(tokens[:, n : n + 1], position, ctx, k + 1)
        return self.to_target_ids(logits[0].argmax(-1))


def _check_config(cfg: HeadConfig) -> None:
    if cfg.draft_vocab_size is None or len(cfg.aux_layer_ids) == 0:
        raise ValueError("DFlash heads need draft_vocab_size and aux_layer_ids")
    if cfg.mask_token_id is None or not 0 <= cfg.mask_token_id < cfg.vocab_size:
        raise ValueError("DFlash heads need a mask_token_id inside the target vocabulary")
    if cfg.block_size is None or cfg.block_size < 2:
        raise ValueError(f"DFlash block_size must be at least 2, got {cfg.block_size}")
    if not 1 <= cfg.num_layers <= MAX_LAYERS:
        raise ValueError(f"DFlash heads take 1..{MAX_LAYERS} layers, got {cfg.num_layers}")


# ---- registry builder (models/heads/registry.py) ----------------------------------------
def build(target: Target, samples: list[Sample], config: TrainConfig) -> DFlashHead:
    """A new head over ``target``'s EAGLE-3 aux layers with the samples' draft vocabulary,
    ``config.dflash_layers`` layers, block ``config.dflash_block_size`` and the P-EAGLE
    mask token (configured, else pad, else eos) (registry builder)."""
    d2t, t2d = draft_vocab_for(target, samples, config.draft_vocab_size)
    cfg = HeadConfig.for_target(
        target,
        draft_vocab_size=int(d2t.shape[0]),
        aux_layer_ids=list(target.aux_layer_ids),
        mask_token_id=mask_token_for(target, config.mask_token_id),
        num_layers=config.dflash_layers,
        block_size=config.dflash_block_size,
    )
    head = DFlashHead(cfg, d2t, t2d)
    head.init_from_target(target.embed_weight(), target.lm_head_weight())
    return head
