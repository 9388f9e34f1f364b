"""EAGLE-1/2 draft head (EAGLE-2 changes only the decoding: a dynamic draft tree).

Structure (the names vLLM's ``EagleLlamaForCausalLM`` loads for method "eagle"):

    fc:       Linear(2h -> h) over cat(embed(x[i+1]), feature(i))
    layers.0: a Llama decoder layer *without* input_layernorm; output = MLP out + residual
    (no final norm); the target's lm_head turns the output into logits.
    embed_tokens / lm_head: the target's, frozen and not saved (vLLM shares both).

``feature(i)`` is the target's last hidden state after its final norm (what vLLM passes an
EAGLE draft). The head is trained to regress feature(i+1) (smooth L1) and to match the
target's next-token distribution through the shared lm_head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from eaglenest.models.heads.base import HeadBatch, HeadLoss, greedy_chain, soft_cross_entropy
from eaglenest.models.heads.layers import (
    KV,
    DraftAttention,
    DraftMLP,
    HeadConfig,
    RMSNorm,
    causal_mask,
    shift_left,
)
from eaglenest.models.target import Capture
from eaglenest.models.training.config import TrainConfig

if TYPE_CHECKING:
    from eaglenest.models.data.template import Sample
    from eaglenest.models.target import Target


class EagleLayer(nn.Module):
    """Llama decoder layer with the input_layernorm removed (EAGLE-1)."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.self_attn = DraftAttention(cfg, input_size=cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(
        self,
        x: torch.Tensor,  # [batch, seq, hidden]
        positions: torch.Tensor,  # [batch, seq]
        mask: torch.Tensor,  # [seq, past + seq] or [batch, seq, past + seq] bool
        past: KV | None,
    ) -> tuple[torch.Tensor, KV]:
        attn, kv = self.self_attn(x, positions, mask, past)
        residual = attn + x
        return self.mlp(self.post_attention_layernorm(residual)) + residual, kv


class EagleHead(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        if cfg.num_layers != 1:
            raise ValueError(f"EAGLE-1/2 heads have one layer, not num_layers={cfg.num_layers}")
        self.cfg = cfg
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head = nn.Linear(h, cfg.vocab_size, bias=False)
        self.lm_head.weight.requires_grad_(False)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList([EagleLayer(cfg)])

    def init_from_target(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> None:
        with torch.no_grad():
            self.embed_tokens.weight.copy_(embed_weight)
            self.lm_head.weight.copy_(lm_head_weight)

    def step(
        self,
        tokens: torch.Tensor,  # [batch, seq] target ids
        hidden: torch.Tensor,  # [batch, seq, hidden] target features or previous draft output
        positions: torch.Tensor,  # [batch, seq]
        mask: torch.Tensor,  # [seq, past + seq] bool
        past: KV | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, KV]:
        """(target-vocab logits, predicted next feature, keys/values so far)."""
        x = self.fc(torch.cat([self.embed_tokens(tokens), hidden], dim=-1))
        out, kv = self.layers[0](x, positions, mask, past)
        return self.lm_head(out), out, kv

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids  # the head speaks the target vocabulary

    def loss(self, batch: HeadBatch, cap: Capture, value_weight: float = 1.0,
             prob_weight: float = 0.1) -> HeadLoss:
        """EAGLE-1 objective: smooth-L1 on the next feature + CE on the next-token dist."""
        b, t = batch.input_ids.shape
        device = batch.input_ids.device
        positions = torch.arange(t, device=device).unsqueeze(0).expand(b, t)
        tokens = shift_left(batch.input_ids, 1)  # slot i: x[i+1]
        logits, out, _ = self.step(tokens, cap.last_hidden, positions, causal_mask(t, 0, device))
        valid = shift_left(batch.loss_mask.bool(), 2, False)  # x[i+2] is an assistant token
        target_feat = shift_left(cap.last_hidden, 1)  # slot i: feature(i+1)
        per_pos = F.smooth_l1_loss(out, target_feat, reduction="none").mean(-1)  # [batch, seq]
        count = max(int(valid.sum()), 1)
        vloss = (per_pos * valid.to(per_pos.dtype)).sum() / count
        probs = F.softmax(shift_left(cap.full_logits(), 1), dim=-1)
        ploss, acc, n = soft_cross_entropy(logits, probs, valid)
        total = value_weight * vloss + prob_weight * ploss
        return HeadLoss(
            loss=total, step_losses=[float(total.detach())], step_accuracy=[acc], step_counts=[n]
        )

    @torch.no_grad()
    def draft_greedy(
        self,
        tokens: torch.Tensor,  # [1, n + 1]: context x[0..n-1] plus the target's next token
        last_hidden: torch.Tensor,  # [1, n, hidden] target features for x[0..n-1]
        k: int,
    ) -> torch.Tensor:
        """Greedy chain of k drafts (target ids, [k])."""
        return greedy_chain(self.step, self.to_target_ids, tokens[:, 1:], last_hidden, k)


# ---- registry builder (models/heads/registry.py) ----------------------------------------
def build(target: Target, samples: list[Sample], config: TrainConfig) -> EagleHead:
    """A new head sharing the target's embeddings and lm_head (registry builder)."""
    head = EagleHead(HeadConfig.for_target(target))
    head.init_from_target(target.embed_weight(), target.lm_head_weight())
    return head
