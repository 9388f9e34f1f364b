"""Save and load draft heads in the formats vLLM loads.

* native EAGLE (method "eagle"): ``architectures: ["LlamaForCausalLM"]``, one layer, keys
  ``fc.weight`` + ``layers.0.*`` (no input_layernorm); embed_tokens and lm_head are not
  written (vLLM shares the target's).
* native EAGLE-3 (method "eagle3"): ``architectures: ["LlamaForCausalLMEagle3"]``, keys
  ``fc.weight``, ``layers.0.*`` (incl. ``hidden_norm``), ``norm.weight``, ``lm_head.weight``,
  ``d2t`` (int64), ``t2d`` (bool); P-EAGLE adds ``mask_hidden`` and ``pard_token`` /
  ``ptd_token_id`` (the keys vLLM's parallel-drafting proposer reads).
* native DFlash (method "dflash"): ``architectures: ["DFlashDraftModel"]``, ``model_type``
  "qwen3", ``target_hidden_size``, ``draft_vocab_size``, ``block_size`` and
  ``dflash_config`` {``target_layer_ids``, ``mask_token_id``, ``block_size``}; keys
  ``fc.weight``, ``hidden_norm.weight``, ``layers.i.*`` (with ``self_attn.{q,k}_norm``),
  ``norm.weight``, ``lm_head.weight``, ``d2t`` / ``t2d`` (only with a reduced vocabulary).
  DFlash's ``target_layer_ids`` count target layer *outputs* (vLLM adds 1): aux layer k
  (the input of layer k) is written k - 1. The public DFlash checkpoints (no lm_head, no
  d2t) load too: the target's lm_head over its whole vocabulary.
* speculators (EAGLE-3 and P-EAGLE): the same weights; config.json carries
  ``speculators_model_type`` ("eagle3" / "peagle"), ``speculators_config`` (proposal
  methods + verifier) and ``transformer_layer_config``; P-EAGLE's ``mask_token_id`` is what
  vLLM maps to ``pard_token``.

Every EAGLE config writes ``norm_before_residual``, ``num_aux_hidden_states``,
``eagle_aux_hidden_state_layer_ids``, ``draft_vocab_size`` and ``mask_token_id`` explicitly.

Training saves float32 (its master weights, checkpoints included: a resume reads them
back exactly); ``export_head`` rewrites a finished head in the dtype it will serve in.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from eaglenest.models.heads.base import draft_head
from eaglenest.models.heads.layers import HeadConfig
from eaglenest.models.heads.registry import (
    CHECKPOINT_FORMATS,
    HEADS,
    HeadSpec,
    head_spec,
    spec_of_config,
)
from eaglenest.models.training.config import TrainConfig

WEIGHTS = "model.safetensors"
PROVENANCE = "provenance.json"
FORMATS = CHECKPOINT_FORMATS
SHARED = ("embed_tokens.weight",)  # never written: vLLM shares the target's embeddings
TARGET_LM_HEAD = "lm_head.weight"  # a head without its own vocabulary uses the target's

if TYPE_CHECKING:
    from eaglenest.models.target import Target


def head_kind(head: nn.Module) -> str:
    return head_spec(head).kind


def _layer_config(cfg: HeadConfig) -> dict[str, Any]:
    """The Llama fields vLLM builds the draft layers from (default RoPE)."""
    return {
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": cfg.num_layers,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "attention_bias": cfg.attention_bias,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def _eagle3_fields(cfg: HeadConfig, spec: HeadSpec) -> dict[str, Any]:
    return {
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.hidden_size,
        "norm_before_residual": cfg.norm_before_residual,
        "norm_before_fc": cfg.norm_before_fc,
        "norm_output": cfg.norm_output,
        "num_aux_hidden_states": len(cfg.aux_layer_ids),
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
        "mask_token_id": cfg.mask_token_id if spec.parallel else None,
    }


def _dflash_config(cfg: HeadConfig, spec: HeadSpec) -> dict[str, Any]:
    """vLLM's DFlashQwen3 layout (qwen3 layers, the block and context keys it reads)."""
    config = {"architectures": [spec.native_architecture], **_layer_config(cfg)}
    config.update(model_type="qwen3", draft_vocab_size=cfg.draft_vocab_size,
                  target_hidden_size=cfg.hidden_size, block_size=cfg.block_size)
    config["dflash_config"] = {
        "target_layer_ids": [k - 1 for k in cfg.aux_layer_ids],  # vLLM adds 1
        "mask_token_id": cfg.mask_token_id,
        "block_size": cfg.block_size,
    }
    return config


def _dflash_fields(config: dict[str, Any]) -> dict[str, Any]:
    """HeadConfig fields of a DFlash config.json (ours or a public checkpoint's)."""
    dflash = config.get("dflash_config") or {}
    layers = dflash.get("target_layer_ids", config.get("target_layer_ids")) or []
    return {
        "aux_layer_ids": [int(k) + 1 for k in layers],
        "mask_token_id": dflash.get("mask_token_id", config.get("mask_token_id")),
        "block_size": dflash.get("block_size", config.get("block_size")),
    }


def build_config(
    head: nn.Module, fmt: str, verifier: str, verifier_arch: str, speculative_tokens: int
) -> dict[str, Any]:
    """config.json for ``head`` in ``fmt`` ("native" or "speculators")."""
    spec, cfg = head_spec(head), draft_head(head).cfg
    if fmt not in FORMATS:
        raise ValueError(f"unknown checkpoint format {fmt!r}; one of {FORMATS}")
    if fmt not in spec.formats:
        raise ValueError(f"{spec.title} heads are saved in vLLM's native "
                         f"{spec.vllm_method!r} format only")
    if not spec.uses_aux:  # vLLM's EAGLE-1 layout: a Llama layer over the last hidden state
        config = {"architectures": [spec.native_architecture], **_layer_config(cfg)}
        config.update(norm_before_residual=False, num_aux_hidden_states=0)
        config.update(eagle_aux_hidden_state_layer_ids=[], draft_vocab_size=None)
        config.update(mask_token_id=None)
    elif spec.block:
        config = _dflash_config(cfg, spec)
    elif fmt == "native":
        config = {"architectures": [spec.native_architecture], **_layer_config(cfg)}
        config.update(_eagle3_fields(cfg, spec))
        config["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
            "use_aux_hidden_state": True,
            "norm_before_fc": cfg.norm_before_fc,
        }
        if spec.parallel:
            config.update(parallel_drafting=True, pard_token=cfg.mask_token_id)
            config["ptd_token_id"] = cfg.mask_token_id
    else:
        config = {"architectures": [spec.speculators_architecture],
                  "speculators_model_type": spec.speculators_type}
        config.update(_eagle3_fields(cfg, spec))
        config["transformer_layer_config"] = _layer_config(cfg)
        config["speculators_config"] = {
            "algorithm": spec.speculators_type,
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": speculative_tokens}
            ],
            "verifier": {"name_or_path": verifier, "architectures": [verifier_arch]},
        }
    config["eaglenest"] = {"head": spec.kind, "format": fmt, "target_architecture": verifier_arch}
    return config


def git_sha() -> str | None:
    if os.environ.get("EAGLENEST_GIT_SHA"):
        return os.environ["EAGLENEST_GIT_SHA"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def save_head(
    head: nn.Module,
    out_dir: str | Path,
    verifier: str = "",
    fmt: str = "native",
    speculative_tokens: int = 3,
    provenance: dict[str, Any] | None = None,
) -> Path:
    """Write config.json + model.safetensors (+ provenance.json) for vLLM; returns out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = draft_head(head).cfg
    config = build_config(head, fmt, verifier, cfg.target_architecture, speculative_tokens)
    spec = head_spec(head)
    skip = SHARED if spec.draft_vocab else (*SHARED, TARGET_LM_HEAD)
    if spec.block and cfg.draft_vocab_size == cfg.vocab_size:  # vLLM: no mapping to load
        skip = (*skip, "d2t", "t2d")
    tensors = {
        k: v.detach().to("cpu").contiguous()
        for k, v in head.state_dict().items()
        if k not in skip
    }
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if provenance is not None:
        record = {"git_sha": git_sha(), "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
        record.update(provenance)
        (out / PROVENANCE).write_text(json.dumps(record, indent=2, default=str) + "\n")
    return out


def export_head(folder: str | Path, dtype: str) -> Path:
    """Rewrite the head ``save_head`` wrote in ``folder`` in ``dtype`` ("float32",
    "bfloat16" or "float16": the dtype it will serve in), in place: its floating tensors
    cast (``d2t`` int64 and ``t2d`` bool kept), config.json's ``torch_dtype`` (and its
    ``transformer_layer_config``'s) says ``dtype``, provenance.json (when there is one)
    records ``"dtype"``. Only ``folder``'s own files change (checkpoints under it stay
    float32). Returns the weights file."""
    from eaglenest.models.target import torch_dtype

    out, target = Path(folder), torch_dtype(dtype)
    state = load_file(str(out / WEIGHTS))
    cast = {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}
    part = out / (WEIGHTS + ".part")
    save_file(cast, str(part), metadata={"format": "pt"})
    part.replace(out / WEIGHTS)
    config = json.loads((out / "config.json").read_text())
    config["torch_dtype"] = dtype
    if isinstance(config.get("transformer_layer_config"), dict):
        config["transformer_layer_config"]["torch_dtype"] = dtype
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if (out / PROVENANCE).is_file():
        record = json.loads((out / PROVENANCE).read_text())
        record["dtype"] = dtype
        (out / PROVENANCE).write_text(json.dumps(record, indent=2, default=str) + "\n")
    return out / WEIGHTS


def read_head_config(folder: str | Path) -> tuple[str, HeadConfig]:
    """(kind, HeadConfig) from a native or speculators config.json."""
    config = json.loads((Path(folder) / "config.json").read_text())
    layer = config.get("transformer_layer_config", config)
    spec = spec_of_config(config)
    heads = int(layer["num_attention_heads"])
    rope = layer.get("rope_parameters") or {}
    aux = config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids", []
    )
    eagle = config.get("eagle_config") or {}
    mask_id = config.get("mask_token_id", config.get("pard_token", config.get("ptd_token_id")))
    cfg = HeadConfig(
        hidden_size=int(layer["hidden_size"]),
        num_attention_heads=heads,
        num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
        head_dim=int(layer.get("head_dim") or layer["hidden_size"] // heads),
        intermediate_size=int(layer["intermediate_size"]),
        vocab_size=int(layer["vocab_size"]),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", layer.get("rope_theta", 10000.0))),
        max_position_embeddings=int(layer.get("max_position_embeddings", 4096)),
        hidden_act=layer.get("hidden_act", "silu"),
        attention_bias=bool(layer.get("attention_bias", False)),
        draft_vocab_size=config.get("draft_vocab_size") if spec.draft_vocab else None,
        aux_layer_ids=list(aux) if spec.uses_aux else [],
        norm_before_residual=bool(config.get("norm_before_residual", False)),
        norm_before_fc=bool(config.get("norm_before_fc", eagle.get("norm_before_fc", False))),
        norm_output=bool(config.get("norm_output", False)),
        mask_token_id=mask_id if spec.parallel else None,
        num_layers=int(layer.get("num_hidden_layers") or 1),
        target_architecture=(config.get("eaglenest") or {}).get(
            "target_architecture", "LlamaForCausalLM"
        ),
    )
    if spec.block:
        cfg = replace(cfg, **_dflash_fields(config))
    if spec.draft_vocab and not cfg.draft_vocab_size:
        cfg.draft_vocab_size = cfg.vocab_size
    return spec.kind, cfg


def _normalise_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Accept the names other EAGLE trainers use: 'midlayer.' (EAGLE-3 reference), 'model.'."""
    out = {}
    for k, v in state.items():
        k = k.removeprefix("model.")
        k = k.replace("midlayer.", "layers.0.")
        out[k] = v
    return out


def load_head(
    folder: str | Path,
    embed_weight: torch.Tensor | None = None,
    lm_head_weight: torch.Tensor | None = None,
) -> nn.Module:
    """Rebuild a head from a checkpoint; the target supplies the shared weights it lacks."""
    kind, cfg = read_head_config(folder)
    spec = HEADS[kind]
    state = _normalise_keys(load_file(str(Path(folder) / WEIGHTS)))
    if spec.draft_vocab:
        # absent (a whole-vocabulary head): identity offsets, every target id drafted
        d2t = state.setdefault("d2t", torch.zeros(cfg.draft_vocab_size or 0, dtype=torch.long))
        t2d = state.setdefault("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
        head: nn.Module = spec.head_class()(cfg, d2t, t2d)
        shared = {"embed_tokens.weight": embed_weight}
        if cfg.draft_vocab_size == cfg.vocab_size:  # a whole-vocabulary head may share it
            shared[TARGET_LM_HEAD] = lm_head_weight
    else:
        head = spec.head_class()(cfg)
        shared = {"embed_tokens.weight": embed_weight, TARGET_LM_HEAD: lm_head_weight}
    for name, tensor in shared.items():
        if name not in state:
            if tensor is None:
                raise ValueError(f"{folder}: checkpoint has no {name}; pass the target's")
            state[name] = tensor.detach().to("cpu", torch.float32)
    if "mask_hidden" in state:
        state["mask_hidden"] = state["mask_hidden"].view(1, 1, -1)
    head.load_state_dict(state, strict=True)
    return head


def load_start_head(folder: str | Path, target: Target, config: TrainConfig) -> nn.Module:
    """The head saved in ``folder`` as a ``config.head`` head: the same kind, or a kind that
    kind starts from (HeadSpec.starts_from: P-EAGLE from EAGLE-3)."""
    head = load_head(folder, target.embed_weight(), target.lm_head_weight())
    cfg = draft_head(head).cfg
    if cfg.hidden_size != target.hidden_size or cfg.vocab_size != target.vocab_size:
        raise ValueError(f"{folder}: head does not match the target's hidden size / vocabulary")
    if cfg.aux_layer_ids and cfg.aux_layer_ids != list(target.aux_layer_ids):
        # e.g. a public DFlash head: load the target with the head's layers (read_head_config)
        raise ValueError(f"{folder}: head reads target layers {cfg.aux_layer_ids}, the target "
                         f"captures {list(target.aux_layer_ids)}; load the target with "
                         f"aux_layer_ids={cfg.aux_layer_ids}")
    kind, spec = head_kind(head), HEADS[config.head]
    if kind == config.head:
        return head
    if kind in spec.starts_from:
        return spec.start_from(head, target, config)
    raise ValueError(f"{folder} holds a {kind} head, not {config.head}"
                     + (f" or {' / '.join(spec.starts_from)}" if spec.starts_from else ""))
