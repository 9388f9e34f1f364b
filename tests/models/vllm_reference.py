"""An independent re-implementation of how vLLM runs a saved draft head.

It reads only the checkpoint folder (config.json + model.safetensors) and the target's
shared weights, and follows vLLM's llama_eagle.py / llama_eagle3.py forward passes and its
proposer's slot convention, so a head whose own drafts match these is saved in a form vLLM
computes the same way. It deliberately shares no code with models.heads.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


class ReferenceDraft:
    def __init__(self, folder: Path, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
        self.cfg = json.loads((folder / "config.json").read_text())
        self.layer_cfg = self.cfg.get("transformer_layer_config", self.cfg)
        self.w = load_file(str(folder / "model.safetensors"))
        self.embed, self.target_lm_head = embed.float(), lm_head.float()
        self.eagle3 = "d2t" in self.w

    # -- pieces ---------------------------------------------------------------------------
    def rms(self, x: torch.Tensor, name: str) -> torch.Tensor:
        eps = self.layer_cfg["rms_norm_eps"]
        return self.w[name] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # x [s, h, d]
        d = x.shape[-1]
        inv = 1.0 / (self.layer_cfg["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
        ang = pos.float()[:, None] * inv[None]
        cos, sin = ang.cos().repeat(1, 2)[:, None], ang.sin().repeat(1, 2)[:, None]
        rot = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
        return x * cos + rot * sin

    def attention(self, x: torch.Tensor, pos: torch.Tensor, layer: int = 0) -> torch.Tensor:
        c, p = self.layer_cfg, f"layers.{layer}.self_attn."  # x [s, in]
        nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        s = x.shape[0]
        q = (x @ self.w[p + "q_proj.weight"].T).view(s, nh, hd)
        k = (x @ self.w[p + "k_proj.weight"].T).view(s, nkv, hd)
        v = (x @ self.w[p + "v_proj.weight"].T).view(s, nkv, hd)
        q, k = self.rope(q, pos), self.rope(k, pos)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / hd**0.5
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(s, nh * hd)
        return out @ self.w[p + "o_proj.weight"].T

    def mlp(self, x: torch.Tensor, layer: int = 0) -> torch.Tensor:
        p = f"layers.{layer}.mlp."
        gate, up = x @ self.w[p + "gate_proj.weight"].T, x @ self.w[p + "up_proj.weight"].T
        return (F.silu(gate) * up) @ self.w[p + "down_proj.weight"].T

    # -- forward (vLLM semantics) ------------------------------------------------------------
    def forward(
        self, tokens: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [s], hidden [s, h] -> (target-vocab logits [s, V], hidden fed back [s, h])."""
        pos = torch.arange(tokens.shape[0])
        emb = self.embed[tokens]
        if not self.eagle3:  # EagleLlamaForCausalLM: fc, layer w/o input_layernorm, no final norm
            x = torch.cat([emb, hidden], -1) @ self.w["fc.weight"].T
            res = self.attention(x, pos) + x
            out = self.mlp(self.rms(res, "layers.0.post_attention_layernorm.weight")) + res
            return out @ self.target_lm_head.T, out
        if self.cfg["norm_before_residual"]:
            hidden = self.rms(hidden, "layers.0.hidden_norm.weight")
            res = hidden
        else:
            res = hidden
            hidden = self.rms(hidden, "layers.0.hidden_norm.weight")
        x = torch.cat([self.rms(emb, "layers.0.input_layernorm.weight"), hidden], -1)
        res = self.attention(x, pos) + res
        h = self.mlp(self.rms(res, "layers.0.post_attention_layernorm.weight"))
        # later layers, as vLLM's fused add-norm runs them: (h, res) -> norm(h + res), h + res
        for i in range(1, self.layer_cfg["num_hidden_layers"]):
            res = h + res
            h = self.attention(self.rms(res, f"layers.{i}.input_layernorm.weight"), pos, i)
            res = h + res
            h = self.mlp(self.rms(res, f"layers.{i}.post_attention_layernorm.weight"), i)
        prenorm = h + res
        normed = self.rms(prenorm, "norm.weight")
        draft_logits = normed @ self.w["lm_head.weight"].T
        # compute_logits: scatter draft logits into the target vocabulary via d2t
        full = draft_logits.new_full((tokens.shape[0], self.embed.shape[0]), float("-inf"))
        targets = torch.arange(draft_logits.shape[-1]) + self.w["d2t"]
        full[:, targets] = draft_logits
        return full, (normed if self.cfg.get("norm_output") else prenorm)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """combine_hidden_states: optional input_norm over all aux states, then fc."""
        if not self.eagle3:
            return aux
        eagle = self.cfg.get("eagle_config") or {}
        if eagle.get("norm_before_fc", self.cfg.get("norm_before_fc", False)):
            aux = self.rms(aux, "input_norm.weight")
        return aux @ self.w["fc.weight"].T

    def chain(self, tokens: torch.Tensor, features: torch.Tensor, k: int) -> list[int]:
        """tokens [n + 1] (context + next token), features [n, *] -> k greedy drafts.

        Recomputes the whole draft sequence each step (no KV cache), as a cross-check.
        """
        slot_tokens, hidden = tokens[1:], self.fuse(features)
        drafts: list[int] = []
        for _ in range(k):
            logits, out = self.forward(slot_tokens, hidden)
            drafts.append(int(logits[-1].argmax()))
            slot_tokens = torch.cat([slot_tokens, torch.tensor([drafts[-1]])])
            hidden = torch.cat([hidden, out[-1:]])
        return drafts

    def parallel(self, tokens: torch.Tensor, aux: torch.Tensor, k: int) -> list[int]:
        """vLLM parallel drafting: K-1 slots of (pard_token, fc(mask_hidden)) appended."""
        pard = self.cfg.get("pard_token", self.cfg.get("mask_token_id"))
        mask_h = self.fuse(self.w["mask_hidden"].view(1, -1)).expand(k - 1, -1)
        slot_tokens = torch.cat([tokens[1:], torch.full((k - 1,), pard)])
        hidden = torch.cat([self.fuse(aux), mask_h])
        logits, _ = self.forward(slot_tokens, hidden)
        n = aux.shape[0]
        return [int(t) for t in logits[n - 1 :].argmax(-1)]
