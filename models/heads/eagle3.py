"""EAGLE-3 draft head: fused multi-layer target features, reduced draft vocabulary, TTT.

Structure (the parameter names are what vLLM's ``Eagle3LlamaForCausalLM`` loads):

    input_norm: RMSNorm(n_aux * h), only with norm_before_fc  normalises the aux states
    fc:        Linear(n_aux * h -> h)                       fuses the target's aux states
    layers.0:  input_layernorm(embed) ++ hidden_norm(hidden) -> attention (2h -> h) -> MLP
    layers.1+: (``num_layers`` > 1) plain pre-norm Llama layers on layer 0's output, as
               vLLM's EAGLE-3 model stacks them (no embeddings, no hidden_norm)
    norm:      final RMSNorm;   lm_head: Linear(h -> draft_vocab)
    d2t / t2d: draft-id -> target-id offsets / target-vocab membership mask
    embed_tokens: the target's embeddings, frozen and not saved (vLLM shares the target's)

Slot convention (same as vLLM's proposer): slot i holds token x[i+1] paired with the
target's features of position i, sits at position i, and predicts x[i+2]. Draft step j
(training-time test) feeds the head's own pre-norm output back as the hidden state, the
token x[i+1+j] at position i+j, and predicts x[i+2+j]. With ``norm_output`` the hidden
fed back is the post-norm one (what the lm_head reads), as vLLM does for that config key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from eaglenest.models.heads.base import HeadBatch, HeadLoss, greedy_chain, scored_steps
from eaglenest.models.heads.layers import (
    KV,
    DraftAttention,
    DraftMLP,
    HeadConfig,
    RMSNorm,
    join_layers,
    shift_left,
    split_layers,
    ttt_mask,
)
from eaglenest.models.heads.vocab import DraftVocabHead, draft_vocab_for
from eaglenest.models.target import Capture
from eaglenest.models.training.config import TrainConfig

if TYPE_CHECKING:
    from eaglenest.models.data.template import Sample
    from eaglenest.models.target import Target


class Eagle3Layer(nn.Module):
    """vLLM's first EAGLE-3 decoder layer: attention input is [norm(embed), norm(hidden)]."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg, input_size=2 * cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(
        self,
        embeds: torch.Tensor,  # [batch, seq, hidden]
        hidden: torch.Tensor,  # [batch, seq, hidden]
        positions: torch.Tensor,  # [batch, seq]
        mask: torch.Tensor,  # [batch or 1, seq, past + seq] bool
        past: KV | None,
    ) -> tuple[torch.Tensor, KV]:
        if self.cfg.norm_before_residual:
            hidden = self.hidden_norm(hidden)
            residual = hidden
        else:
            residual = hidden
            hidden = self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(embeds), hidden], dim=-1)  # [batch, seq, 2h]
        attn, kv = self.self_attn(x, positions, mask, past)
        residual = attn + residual
        out = self.mlp(self.post_attention_layernorm(residual)) + residual
        return out, kv  # out is the pre-norm hidden state fed to the next draft step


class DecoderLayer(nn.Module):
    """A plain pre-norm Llama decoder layer: vLLM's EAGLE-3 layers after the first."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg, input_size=cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(
        self,
        x: torch.Tensor,  # [batch, seq, hidden] the previous layer's output (pre-norm)
        positions: torch.Tensor,  # [batch, seq]
        mask: torch.Tensor,  # [batch or 1, seq, past + seq] bool
        past: KV | None,
    ) -> tuple[torch.Tensor, KV]:
        attn, kv = self.self_attn(self.input_layernorm(x), positions, mask, past)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class Eagle3Head(DraftVocabHead):
    """EAGLE-3 head. ``d2t``/``t2d`` come from ``models.heads.vocab.build_draft_vocab``."""

    def __init__(self, cfg: HeadConfig, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        super().__init__()
        if cfg.draft_vocab_size is None or len(cfg.aux_layer_ids) == 0:
            raise ValueError("EAGLE-3 heads need draft_vocab_size and aux_layer_ids")
        if d2t.shape != (cfg.draft_vocab_size,) or t2d.shape != (cfg.vocab_size,):
            raise ValueError("d2t must be [draft_vocab_size] and t2d [vocab_size]")
        self.cfg = cfg
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)
        width = len(cfg.aux_layer_ids) * h
        self.input_norm = RMSNorm(width, cfg.rms_norm_eps) if cfg.norm_before_fc else None
        self.fc = nn.Linear(width, h, bias=False)
        if cfg.num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {cfg.num_layers}")
        extra: list[nn.Module] = [DecoderLayer(cfg) for _ in range(cfg.num_layers - 1)]
        self.layers = nn.ModuleList([Eagle3Layer(cfg), *extra])
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", d2t.long().clone())
        self.register_buffer("t2d", t2d.bool().clone())

    # ---- pieces used by training and by decoding -------------------------------------
    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """[..., n_aux * hidden] target aux states -> [..., hidden] (vLLM combine_hidden_states)."""
        if self.input_norm is not None:
            aux = self.input_norm(aux)
        return self.fc(aux)

    def step(
        self,
        tokens: torch.Tensor,  # [batch, seq] target ids
        hidden: torch.Tensor,  # [batch, seq, hidden] fused features or previous pre-norm output
        positions: torch.Tensor,  # [batch, seq]
        mask: torch.Tensor,  # [batch or 1, seq, past + seq] bool
        past: KV | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, KV]:
        """One draft forward: (draft-vocab logits, hidden for the next step, keys/values).

        The hidden handed on is the last layer's pre-norm output, or the post-norm one when
        ``norm_output`` is set. With several layers the keys/values are stacked per layer
        along the kv-heads dim (``split_layers``).
        """
        pasts = split_layers(past, len(self.layers))
        out, kv = self.layers[0](self.embed_tokens(tokens), hidden, positions, mask, pasts[0])
        kvs = [kv]
        for layer, layer_past in zip(self.layers[1:], pasts[1:], strict=True):
            out, kv = layer(out, positions, mask, layer_past)
            kvs.append(kv)
        normed = self.norm(out)
        return self.lm_head(normed), (normed if self.cfg.norm_output else out), join_layers(kvs)

    # ---- training ----------------------------------------------------------------------
    def ttt_forward(
        self,
        input_ids: torch.Tensor,  # [batch, seq] teacher tokens x[0..seq-1]
        aux: torch.Tensor,  # [batch, seq, n_aux * hidden]
        steps: int,
    ) -> list[torch.Tensor]:
        """Draft-vocab logits [batch, seq, draft_vocab] of every TTT step.

        Step j, slot i: token x[i+1+j] at position i+j, hidden = the head's own pre-norm
        output of step j-1 at slot i (step 0: fc(aux[i])), predicting x[i+2+j].
        """
        b, t = input_ids.shape
        device = input_ids.device
        hidden = self.combine(aux)
        base_pos = torch.arange(t, device=device).unsqueeze(0).expand(b, t)
        past: KV | None = None
        out = []
        for j in range(steps):
            tokens = shift_left(input_ids, 1 + j)  # slot i: x[i+1+j]
            mask = ttt_mask(t, j, device)
            logits, hidden, past = self.step(tokens, hidden, base_pos + j, mask, past)
            out.append(logits)
        return out

    def loss(self, batch: HeadBatch, cap: Capture, steps: int = 3, decay: float = 0.8) -> HeadLoss:
        """Training-time test over ``steps`` draft steps, step j weighted decay**j."""
        probs, in_vocab = self.target_distribution(cap)
        all_logits = self.ttt_forward(batch.input_ids, cap.aux, steps)
        return scored_steps(all_logits, probs, in_vocab, batch.loss_mask.bool(), decay)

    # ---- decoding ------------------------------------------------------------------------
    @torch.no_grad()
    def draft_greedy(
        self,
        tokens: torch.Tensor,  # [1, n + 1]: the context x[0..n-1] plus the target's next token
        aux: torch.Tensor,  # [1, n, n_aux * hidden] target aux states for x[0..n-1]
        k: int,
    ) -> torch.Tensor:
        """Greedy chain of k drafts (target ids, [k]) after ``tokens``."""
        return greedy_chain(self.step, self.to_target_ids, tokens[:, 1:], self.combine(aux), k)


# ---- registry builder (models/heads/registry.py) ----------------------------------------
def build(target: Target, samples: list[Sample], config: TrainConfig) -> Eagle3Head:
    """A new head with the samples' draft vocabulary (registry builder)."""
    d2t, t2d = draft_vocab_for(target, samples, config.draft_vocab_size)
    head = Eagle3Head(layer_config(target, d2t, config), d2t, t2d)
    head.init_from_target(target.embed_weight(), target.lm_head_weight())
    return head


def layer_config(target: Target, d2t: torch.Tensor, config: TrainConfig, **kw: Any) -> HeadConfig:
    """The EAGLE-3 layout for ``target``: its aux layers, the training recipe's norms."""
    return HeadConfig.for_target(
        target,
        draft_vocab_size=int(d2t.shape[0]),
        aux_layer_ids=list(target.aux_layer_ids),
        norm_before_residual=config.norm_before_residual,
        norm_before_fc=config.norm_before_fc,
        norm_output=config.norm_output,
        num_layers=config.num_layers,
        **kw,
    )
