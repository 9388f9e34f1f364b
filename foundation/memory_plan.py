"""What a model server needs of its GPUs, planned from the model's files alone (no weights
read, no GPU touched): docs/gpu-memory.md says the same in prose.

Contract:
- `read_shape(config, index, weights_bytes)` / `shape_of(folder)`: a target's `ModelShape`
  from config.json plus the safetensors index (its ``metadata.total_size``: the bytes in
  the checkpoint's own dtype) or, without one, the bytes of its ``*.safetensors`` files.
  `ShapeError` when config.json lacks what a plan needs.
- `head_of(folder)` / `head_estimate(...)`: a draft head's parameters and attention layers,
  from its saved files, or estimated before it is trained (a job's Create).
- `tensor_parallel(shape, gpus, wanted, variable)`: the tensor-parallel degree. Default: the
  largest d <= gpus that divides the attention heads, where the KV heads split evenly
  (kv % d == 0) or are replicated evenly (d % kv == 0): vLLM 0.32's rules (ModelConfig's
  "Total number of attention heads must be divisible by tensor parallel size", and
  QKVParallelLinear's division of the KV heads). A `wanted` degree that breaks them, or
  is more than `gpus`, raises PlanError naming `variable` and the heads.
- `plan(shape, gpus, wants, head)`: the `MemoryPlan` of one server on `gpus`, or PlanError
  whose message names the sizes (weights, head, overhead, KV cache, the GPUs' memory).
  Per GPU, with the GPU's bytes G, the share u (--gpu-memory-utilization, default
  DEFAULT_UTILIZATION, divided between `copies` servers) and the dtype's bytes b:
      weights  = parameters x b / tp            (a quantized checkpoint: its stored bytes)
      head     = head parameters x b            (draft_tensor_parallel_size 1: whole)
      overhead = FIXED_OVERHEAD + PROFILE_TOKENS x (4 x hidden + 2 x intermediate / tp) x b
                 + max_num_seqs x vocab x 4     (vLLM's profiling forward and sampler)
      kv/token = 2 x (attention layers + head layers) x kv_heads_per_gpu x head_dim x b
      kv tokens = (u x G - weights - head - overhead) / kv/token
  It fits when kv tokens >= the length asked for (explicit), else >= min(model's max,
  MIN_CONTEXT). Default max_model_len: the model's own max, bounded by half the KV tokens
  (two full-length sequences at once) and never below min(model's max, MIN_CONTEXT).
- On the CPU (no GPUs) the plan only fixes the length: explicit, else min(model's max,
  CPU_MAX_MODEL_LEN); dtype float32 unless asked (exact greedy output).
Pure: json and dataclasses only.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eaglenest.foundation.dtypes import AUTO, BYTES, FLOAT32, checkpoint_dtype, for_gpu
from eaglenest.foundation.host.gpus import MEMORY_TOLERANCE
from eaglenest.foundation.instance_types import InstanceType

GIB = 2**30
#: vLLM's --gpu-memory-utilization when the container names none (vLLM's own default is
#: 0.92; a little less leaves room for what torch and NCCL allocate outside its count)
DEFAULT_UTILIZATION = 0.90
#: per GPU, outside weights and KV: the CUDA context, NCCL and the allocator's slack
FIXED_OVERHEAD = GIB
#: tokens of vLLM's profiling forward (its max_num_batched_tokens on large GPUs)
PROFILE_TOKENS = 8192
#: sequences the sampler's profile holds logits for, when max_num_seqs is not set
PROFILE_SEQS = 256
#: the least context a default plan gives (or the model's max, when smaller)
MIN_CONTEXT = 2048
CPU_MAX_MODEL_LEN = 2048
_MAX_POSITION_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length",
                      "n_positions", "model_max_length")
_ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "attention")


class ShapeError(ValueError):
    """config.json lacks a field a plan needs; the message names it."""


class PlanError(ValueError):
    """The model cannot run as asked on these GPUs; the message names the sizes."""


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    layers: int
    attention_layers: int  # layers that keep a KV cache (hybrid models: fewer)
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_position: int
    checkpoint_dtype: str
    checkpoint_bytes: int
    quantization: str = ""  # config.json's quantization_config.quant_method

    @property
    def parameters(self) -> int:
        return self.checkpoint_bytes // BYTES[self.checkpoint_dtype]

    def weight_bytes(self, dtype: str) -> int:
        """The weights' bytes loaded in `dtype` (a quantized checkpoint loads as stored)."""
        if self.quantization:
            return self.checkpoint_bytes
        return self.parameters * BYTES[dtype]

    def describe(self) -> str:
        return f"{self.architecture}, {self.parameters / 1e9:.2f}B parameters"


def _int(config: dict[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    if default is None:
        raise ShapeError(f"config.json has no {keys[0]}")
    return default


def _attention_layers(config: dict[str, Any], layers: int) -> int:
    """Layers with a KV cache: ``layer_types`` where given (linear-attention layers keep a
    fixed state instead), else every layer but those a ``full_attention_interval`` skips."""
    types = config.get("layer_types")
    if isinstance(types, list) and types:
        return sum(1 for t in types if t in _ATTENTION_LAYER_TYPES)
    interval = config.get("full_attention_interval")
    if isinstance(interval, int) and interval > 1:
        return layers // interval
    return layers


def read_shape(config: dict[str, Any], index: dict[str, Any] | None,
               weights_bytes: int | None) -> ModelShape:
    """The shape of a target from its config.json (and its safetensors index, or the bytes
    of its weight files when it has none)."""
    own = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    assert isinstance(own, dict)
    layers = _int(own, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _int(own, "hidden_size", "n_embd", "d_model")
    heads = _int(own, "num_attention_heads", "n_head")
    kv_heads = _int(own, "num_key_value_heads", default=heads)
    total = (index or {}).get("metadata", {}).get("total_size")
    size = int(total) if isinstance(total, int | float) and total > 0 else int(weights_bytes or 0)
    if size <= 0:
        raise ShapeError("the model has no safetensors weights to size (model.safetensors, "
                         "or model.safetensors.index.json with metadata.total_size)")
    quant = own.get("quantization_config") or config.get("quantization_config") or {}
    archs = config.get("architectures") or ["(no architecture)"]
    return ModelShape(
        architecture=str(archs[0]), layers=layers,
        attention_layers=_attention_layers(own, layers), hidden=hidden, heads=heads,
        kv_heads=kv_heads, head_dim=_int(own, "head_dim", default=hidden // heads),
        intermediate=_int(own, "intermediate_size", "moe_intermediate_size",
                          default=4 * hidden),
        vocab=_int(own, "vocab_size"), max_position=_int(own, *_MAX_POSITION_KEYS,
                                                         default=MIN_CONTEXT),
        checkpoint_dtype=checkpoint_dtype(config), checkpoint_bytes=size,
        quantization=str(quant.get("quant_method") or "") if isinstance(quant, dict) else "")


def shape_of(folder: Path) -> ModelShape:
    """`read_shape` of a model folder on disk."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ShapeError(f"config.json cannot be read: {exc}") from None
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else None
    files = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    return read_shape(config, index, files)


@dataclass(frozen=True)
class HeadShape:
    parameters: int
    layers: int  # its own attention layers, each with a KV cache of the target's shape


def head_from(config: dict[str, Any], weights_bytes: int) -> HeadShape:
    """A saved head's shape from its config.json and its safetensors bytes: parameters are
    the bytes over its dtype's, layers its ``num_hidden_layers`` (1 when absent)."""
    text = config.get("text_config")
    own: dict[str, Any] = text if isinstance(text, dict) else config
    return HeadShape(weights_bytes // BYTES[checkpoint_dtype(config)],
                     _int(own, "num_hidden_layers", default=1))


def head_of(folder: Path) -> HeadShape:
    """`head_from` of a head folder on disk (an unreadable config.json counts as empty)."""
    config: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        config = json.loads((folder / "config.json").read_text())
    return head_from(config, sum(p.stat().st_size for p in folder.glob("*.safetensors")))


#: the draft vocabulary an optimization job trains when EAGLENEST_DRAFT_VOCAB_SIZE is unset
DEFAULT_DRAFT_VOCAB = 8192


def head_estimate(shape: ModelShape, layers: int = 1,
                  draft_vocab: int | None = DEFAULT_DRAFT_VOCAB,
                  aux_layers: int = 3) -> HeadShape:
    """An EAGLE-3 head's parameters before it exists (the largest kind: a 2h-wide layer
    input, an `aux_layers` x h fusion, its own lm_head over the draft vocabulary; the
    embeddings are the target's, which vLLM shares with a head that has none):
        per layer  2h x (heads + 2 kv) x head_dim + heads x head_dim x h + 3 x h x inter
        fc         aux_layers x h x h;   lm_head  draft_vocab x h
    Example: Llama-3.1-8B, 1 layer, draft vocab 8192 -> 0.33B parameters (0.65 GB bf16)."""
    h, hd = shape.hidden, shape.head_dim
    layer = (2 * h * (shape.heads + 2 * shape.kv_heads) * hd + shape.heads * hd * h
             + 3 * h * shape.intermediate)
    vocab = min(draft_vocab or shape.vocab, shape.vocab)
    return HeadShape(layers * layer + aux_layers * h * h + vocab * h, layers)


def _degree_ok(shape: ModelShape, tp: int) -> bool:
    kv_ok = shape.kv_heads % tp == 0 if shape.kv_heads >= tp else tp % shape.kv_heads == 0
    return shape.heads % tp == 0 and kv_ok


def tensor_parallel(shape: ModelShape, gpus: int, wanted: int | None = None,
                    variable: str = "tensor parallel degree") -> int:
    """The tensor-parallel degree on `gpus` GPUs (module contract); 1 on the CPU."""
    if gpus <= 0:
        return 1
    if wanted is None:
        return max(d for d in range(1, gpus + 1) if _degree_ok(shape, d))
    if wanted > gpus:
        raise PlanError(f"{variable}={wanted} asks for more GPUs than the instance holds "
                        f"({gpus})")
    if not _degree_ok(shape, wanted):
        ok = [d for d in range(1, gpus + 1) if _degree_ok(shape, d)]
        raise PlanError(
            f"{variable}={wanted} does not divide the model's attention heads: "
            f"{shape.architecture} has {shape.heads} attention heads and {shape.kv_heads} "
            f"KV heads; degrees that work on {gpus} GPU(s): {', '.join(map(str, ok))}")
    return wanted


@dataclass(frozen=True)
class Gpus:
    """The GPUs one server (or one job) holds: how many, the bytes of each, their compute
    capability (None: unknown), and how to name them in a message."""

    count: int
    memory_bytes: int
    capability: float | None = None
    label: str = ""


def gpus_of_type(itype: InstanceType, count: int | None = None) -> Gpus:
    """The GPUs of `itype` (`count` of them: what one process holds, default all) as a plan
    sees them: each the least memory a GPU of the type may report and still hold it
    (foundation/host/gpus.py MEMORY_TOLERANCE: an A10G "24 GiB" reports 22.5), so Create and the
    worker plan alike whatever the host's GPU reports."""
    n = itype.accelerators if count is None else count
    return Gpus(n, int(itype.memory_gib * MEMORY_TOLERANCE * GIB), itype.compute_capability,
                f"{itype.name} ({itype.accelerators} x {itype.accelerator} "
                f"{itype.memory_gib:g} GiB)")


@dataclass(frozen=True)
class Wants:
    """What the container (or job) asked for; None: the plan chooses."""

    dtype: str = AUTO
    tensor_parallel: int | None = None
    tp_variable: str = "tensor parallel degree"
    max_model_len: int | None = None
    len_variable: str = "max model length"
    max_num_seqs: int | None = None
    gpu_memory_utilization: float | None = None
    copies: int = 1  # servers that share the GPUs (split serving: 2)


@dataclass(frozen=True)
class MemoryPlan:
    dtype: str
    tensor_parallel: int
    max_model_len: int
    gpu_memory_utilization: float | None  # None on the CPU
    max_num_seqs: int | None
    weights_per_gpu: int = 0
    head_per_gpu: int = 0
    overhead_per_gpu: int = 0
    kv_per_token: int = 0  # bytes per token per GPU, target and head
    kv_tokens: int = 0  # tokens the KV cache holds (per server)
    gpu_bytes: int = 0
    dtype_reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if not self.gpu_bytes:
            return f"CPU, {self.dtype}, max model length {self.max_model_len}"
        return (f"{self.dtype}, tensor parallel {self.tensor_parallel}; per GPU of "
                f"{gib(self.gpu_bytes)} at {self.gpu_memory_utilization:g}: weights "
                f"{gib(self.weights_per_gpu)}, head {gib(self.head_per_gpu)}, overhead "
                f"{gib(self.overhead_per_gpu)}, KV cache {self.kv_tokens} tokens "
                f"({gib(self.kv_tokens * self.kv_per_token)}); max model length "
                f"{self.max_model_len}")


def _round(tokens: int) -> int:
    return max(16, tokens // 16 * 16)


def plan(shape: ModelShape, gpus: Gpus, wants: Wants = Wants(),
         head: HeadShape | None = None) -> MemoryPlan:
    """One server's plan (module contract); PlanError naming the sizes when it cannot fit."""
    if wants.max_model_len is not None and wants.max_model_len > shape.max_position:
        raise PlanError(f"{wants.len_variable}={wants.max_model_len} is more than the "
                        f"model's own maximum, {shape.max_position} tokens (config.json)")
    if gpus.count <= 0:
        length = wants.max_model_len or min(shape.max_position, CPU_MAX_MODEL_LEN)
        return MemoryPlan(FLOAT32 if wants.dtype == AUTO else wants.dtype, 1, length, None,
                          wants.max_num_seqs)
    tp = tensor_parallel(shape, gpus.count, wants.tensor_parallel, wants.tp_variable)
    dtype, reason = for_gpu(wants.dtype, shape.checkpoint_dtype, gpus.capability)
    b = BYTES[dtype]
    share = (wants.gpu_memory_utilization or DEFAULT_UTILIZATION) / max(1, wants.copies)
    weights = -(-shape.weight_bytes(dtype) // tp)
    head_bytes = head.parameters * b if head else 0
    seqs = wants.max_num_seqs or PROFILE_SEQS
    overhead = (FIXED_OVERHEAD + PROFILE_TOKENS * (4 * shape.hidden + 2 * shape.intermediate
                                                   // tp) * b + seqs * shape.vocab * 4)
    kv_heads = max(1, shape.kv_heads // tp)
    kv_token = 2 * (shape.attention_layers + (head.layers if head else 0)) * kv_heads \
        * shape.head_dim * b
    free = int(share * gpus.memory_bytes) - weights - head_bytes - overhead
    kv_tokens = max(0, free) // kv_token
    floor = min(shape.max_position, MIN_CONTEXT)
    need = wants.max_model_len or floor
    if kv_tokens < need:
        raise PlanError(_refusal(shape, gpus, tp, dtype, share, weights, head_bytes, overhead,
                                 need, kv_token, wants))
    length = wants.max_model_len or min(shape.max_position, max(floor, _round(kv_tokens // 2)))
    return MemoryPlan(dtype, tp, length, round(share, 4), wants.max_num_seqs, weights,
                      head_bytes, overhead, kv_token, kv_tokens, gpus.memory_bytes, reason)


def _refusal(shape: ModelShape, gpus: Gpus, tp: int, dtype: str, share: float, weights: int,
             head: int, overhead: int, need: int, kv_token: int, wants: Wants) -> str:
    asked = (f" ({wants.len_variable})" if wants.max_model_len else "")
    on = gpus.label or f"{gpus.count} GPU(s) of {gib(gpus.memory_bytes)}"
    return (f"the model does not fit {on}: {shape.describe()} needs, per GPU at tensor "
            f"parallel {tp} in {dtype}, {gib(weights)} of weights + {gib(head)} for the draft "
            f"head + {gib(overhead)} of overhead + {gib(need * kv_token)} of KV cache for "
            f"{need} tokens{asked} = {gib(weights + head + overhead + need * kv_token)}, but "
            f"each GPU gives {gib(share * gpus.memory_bytes)} ({share:g} of "
            f"{gib(gpus.memory_bytes)})")
