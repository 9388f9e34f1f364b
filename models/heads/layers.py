"""Building blocks shared by the draft heads: config, RMSNorm, RoPE, attention, masks.

Parameter names follow the Llama layout vLLM's EAGLE loaders expect
(``self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``, ``input_layernorm``,
``post_attention_layernorm``, ``hidden_norm``), so a head's ``state_dict`` is saved as is.
Attention takes an explicit boolean mask (True = may attend) so training-time-test and
parallel-drafting masks are plain tensors that tests can check by hand.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

if TYPE_CHECKING:
    from eaglenest.models.target import Target


@dataclass
class HeadConfig:
    """Architecture of a draft head (Llama-style decoder layers plus their extras)."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's vocabulary
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    hidden_act: str = "silu"
    attention_bias: bool = False
    draft_vocab_size: int | None = None  # EAGLE-3 / P-EAGLE reduced vocabulary
    aux_layer_ids: list[int] = field(default_factory=list)  # EAGLE-3 / P-EAGLE
    norm_before_residual: bool = False
    norm_before_fc: bool = False  # EAGLE-3 / P-EAGLE: RMSNorm over the concatenated aux states
    norm_output: bool = False  # EAGLE-3 / P-EAGLE: next draft step gets the post-norm hidden
    mask_token_id: int | None = None  # P-EAGLE, DFlash
    num_layers: int = 1  # EAGLE-3 / P-EAGLE: layer 0 is EAGLE-3's, the rest plain Llama layers
    block_size: int | None = None  # DFlash: query slots of one block (anchor + mask slots)
    target_architecture: str = "LlamaForCausalLM"
    tie_word_embeddings: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def for_target(cls, target: Target, **overrides: Any) -> HeadConfig:
        """``from_target_config`` of a loaded target (what a new head is built from)."""
        return cls.from_target_config(target.config, target.architecture, **overrides)

    @classmethod
    def from_target_config(cls, config: Any, architecture: str, **overrides: Any) -> HeadConfig:
        """Draft layer shaped like the target's attention; RoPE is always the default kind."""
        heads = int(config.num_attention_heads)
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        values: dict[str, Any] = dict(
            hidden_size=int(config.hidden_size),
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(config, "num_key_value_heads", heads) or heads),
            head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
            intermediate_size=_dense_intermediate_size(config),
            vocab_size=int(config.vocab_size),
            rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=int(getattr(config, "max_position_embeddings", 4096)),
            target_architecture=architecture,
        )
        values.update(overrides)
        return cls(**values)


def _dense_intermediate_size(config: Any) -> int:
    # MoE targets (Qwen3-MoE, GPT-OSS, Qwen3-Next) list a per-expert size; a dense draft
    # MLP uses the dense size when there is one, else 4x hidden rounded like Llama.
    size = getattr(config, "intermediate_size", None)
    if size and int(size) >= int(config.hidden_size):
        return int(size)
    return int(config.hidden_size) * 4


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., size]
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_cos_sin(
    positions: torch.Tensor,  # [batch, seq] long
    head_dim: int,
    theta: float,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Default (neox-style) rotary tables, [batch, seq, head_dim] each."""
    inv = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    )
    angles = positions.float().unsqueeze(-1) * inv  # [batch, seq, head_dim / 2]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [batch, heads, seq, head_dim]; cos/sin: [batch, seq, head_dim]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


KV = tuple[torch.Tensor, torch.Tensor]  # keys, values: [batch, kv_heads, seq, head_dim]


def split_layers(past: KV | None, layers: int) -> list[KV | None]:
    """One head-level KV -> each layer's. A multi-layer head stacks its layers' keys/values
    along the kv-heads dim, so decoding code that crops, pads or gathers along batch and seq
    never needs to know how many layers the head has.

    Example 2 layers, kv_heads=3: keys [1, 6, seq, d] -> layer 0 keys[:, 0:3], layer 1 [:, 3:6].
    """
    if past is None:
        return [None] * layers
    keys, values = past[0].chunk(layers, dim=1), past[1].chunk(layers, dim=1)
    return list(zip(keys, values, strict=True))


def join_layers(kvs: list[KV]) -> KV:
    """Inverse of ``split_layers``: [batch, kv_heads, seq, d] x L -> [batch, L * kv_heads, ...]."""
    if len(kvs) == 1:
        return kvs[0]
    return torch.cat([k for k, _ in kvs], dim=1), torch.cat([v for _, v in kvs], dim=1)


class DraftAttention(nn.Module):
    def __init__(self, cfg: HeadConfig, input_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(input_size, nh * hd, bias=bias)
        self.k_proj = nn.Linear(input_size, nkv * hd, bias=bias)
        self.v_proj = nn.Linear(input_size, nkv * hd, bias=bias)
        self.o_proj = nn.Linear(nh * hd, cfg.hidden_size, bias=bias)

    def forward(
        self,
        x: torch.Tensor,  # [batch, seq, input_size]
        positions: torch.Tensor,  # [batch, seq] long
        mask: torch.Tensor,  # [seq, past + seq] or [batch, seq, past + seq] bool, True = attend
        past: KV | None = None,
    ) -> tuple[torch.Tensor, KV]:
        b, s, _ = x.shape
        if mask.dim() == 2:
            mask = mask.unsqueeze(0)
        cfg = self.cfg
        q = self.q_proj(x).view(b, s, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        out = grouped_attention(q, k, v, mask)
        out = out.transpose(1, 2).reshape(b, s, cfg.num_attention_heads * cfg.head_dim)
        return self.o_proj(out), (k, v)


def grouped_attention(
    q: torch.Tensor,  # [batch, heads, queries, head_dim]
    k: torch.Tensor,  # [batch, kv_heads, keys, head_dim]
    v: torch.Tensor,  # [batch, kv_heads, keys, head_dim]
    mask: torch.Tensor,  # [batch or 1, queries, keys] bool, True = attend
) -> torch.Tensor:
    """Softmax attention with grouped keys/values (each kv head serves heads // kv_heads
    query heads), scaled by 1/sqrt(head_dim): [batch, heads, queries, head_dim]."""
    groups = q.shape[1] // k.shape[1]
    kr = k.repeat_interleave(groups, dim=1)
    vr = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(
        q, kr, vr, attn_mask=mask.unsqueeze(1), scale=1.0 / math.sqrt(q.shape[-1])
    )


class DraftMLP(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = ACT2FN[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., hidden]
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def causal_mask(seq: int, past: int = 0, device: torch.device | None = None) -> torch.Tensor:
    """[seq, past + seq] bool: query i sees every cached key and new keys 0..i.

    Example seq=2, past=1: [[1, 1, 0],
                            [1, 1, 1]]
    """
    new = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    return torch.cat([torch.ones(seq, past, dtype=torch.bool, device=device), new], dim=1)


def ttt_mask(seq: int, step: int, device: torch.device | None = None) -> torch.Tensor:
    """Training-time-test mask for draft step ``step`` (0-based): [seq, seq * (step + 1)].

    Keys are laid out step by step: block 0 = the step-0 keys of every slot (computed from
    the target's features), block m = the keys slot i produced at draft step m. A query at
    slot i in step j sees block 0 causally (slots 0..i) and, in blocks 1..j, only its own
    slot i -- exactly the KV cache a chain drafted from position i holds at inference.

    Example seq=3, step=1 (columns: block 0 slots 0..2 | block 1 slots 0..2):
        [[1, 0, 0,  1, 0, 0],
         [1, 1, 0,  0, 1, 0],
         [1, 1, 1,  0, 0, 1]]
    """
    blocks = [torch.ones(seq, seq, dtype=torch.bool, device=device).tril()]
    eye = torch.eye(seq, dtype=torch.bool, device=device)
    blocks.extend(eye for _ in range(step))
    return torch.cat(blocks, dim=1)


def shift_left(x: torch.Tensor, n: int, fill: float | int = 0) -> torch.Tensor:
    """Shift along dim 1 by n: out[:, i] = x[:, i + n], the tail filled with ``fill``.

    Example n=2: [a, b, c, d] -> [c, d, fill, fill].
    """
    if n == 0:
        return x
    tail = torch.full_like(x[:, :n], fill)
    return torch.cat([x[:, n:], tail], dim=1)
