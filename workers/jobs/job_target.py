"""An optimization job's target on its device (docs/gpu-memory.md): the head kind it trains,
the dtype it runs in, how it is loaded, what the vLLM children are given, the GPU memory it
leaves behind, and the head exported in its dtype.

Contract:
- `check_head(options, support)`: the head kind (EAGLENEST_HEAD, else the architecture's
  default), or InputError when the options ask what that kind or architecture cannot do
  (OptionError for the block options: workers/jobs/options.py ``check_kind``).
- `job_dtype(model_dir, wanted, device, capability)`: (dtype, reason). The CPU: float32,
  whatever EAGLENEST_DTYPE says (exact, as tests and the CPU servers expect). CUDA:
  foundation/dtypes.py ``for_gpu(EAGLENEST_DTYPE or auto, the checkpoint's dtype from
  config.json, the job's GPUs' compute capability)``: a bfloat16 checkpoint runs in
  bfloat16 on an L40S (8.9) and float16 on a T4 (7.5), the reason saying why.
- `load(model_dir, backend, device, dtype, aux_layer_ids)`: the whole target on ``device`` in
  ``dtype``, or, when vLLM captures, only its ends (models/target.py ``load_target_ends``) on
  the CPU in ``dtype``; the torchrun ranks load theirs in the same dtype and layers
  (run.json's ``dtype``, ``aux_layer_ids``).
- `start_head(init_head)`: a starting head's (the `eagle_model` channel's) kind, the target
  layers it reads its features from, which the job's target then captures (a public DFlash
  head's ``target_layer_ids`` need not be EagleNest's default layers), and its block;
  `inherit(options, start)`: a block head trained further keeps its block unless
  EAGLENEST_DFLASH_BLOCK_SIZE sets one.
- `vllm_capture(...)`: the vLLM children's settings: the job's dtype, a tensor-parallel
  degree that divides the target's attention heads (foundation/memory_plan.py
  ``tensor_parallel``: Qwen2.5-7B's 28 heads on 8 GPUs -> 4), and for the capture child a
  GPU share (`capture_utilization`) that leaves its first GPU room for the target's ends.
- `release()`: models/target.py ``release_gpu_memory`` (a dropped target's GPU memory goes
  back to the driver before torchrun's ranks and the benchmark's servers start).
- `export(folder, dtype)`: the trained head in ``folder`` rewritten in ``dtype`` (the dtype
  it serves in: float32 on the CPU), its checkpoints kept float32 (models/checkpoint.py
  ``export_head``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglenest.foundation.dtypes import AUTO, BYTES, FLOAT32, checkpoint_dtype, for_gpu
from eaglenest.foundation.host.gpus import MEMORY_TOLERANCE
from eaglenest.foundation.memory_plan import (
    DEFAULT_UTILIZATION,
    FIXED_OVERHEAD,
    GIB,
    ModelShape,
    shape_of,
    tensor_parallel,
)
from eaglenest.models.heads.registry import HEADS
from eaglenest.workers.infra.model_fetch import InputError
from eaglenest.workers.jobs.capture_stage import ENDS_CHUNK, VllmCapture
from eaglenest.workers.jobs.options import JobOptions, check_kind
from eaglenest.workers.jobs.placing import JobGpus

log = logging.getLogger("eaglenest.optimize")


def check_head(options: JobOptions, support: Any) -> str:
    """The head kind the job trains on a target of ``support`` (models/target.py
    ArchitectureSupport); InputError naming the variable that asks too much."""
    head_kind = options.head or support.head
    head_spec, listed = HEADS[head_kind], HEADS[support.head]
    if head_spec.uses_aux and not listed.uses_aux:
        raise InputError(f"{support.architecture} supports only EAGLE-2 heads "
                         f"(EAGLENEST_HEAD={listed.kind}), not {head_kind}")
    if not head_spec.multi_layer and options.num_layers != 1:
        raise InputError(f"EAGLENEST_NUM_LAYERS={options.num_layers}: EAGLE-2 heads "
                         f"(the {support.architecture} default) have one layer")
    if not head_spec.partitions and options.seq_partitions != 1:
        raise InputError(f"EAGLENEST_SEQ_PARTITIONS={options.seq_partitions} needs a "
                         f"P-EAGLE head ({head_kind}: the {support.architecture} default)")
    check_kind(options, head_kind)
    return head_kind


def job_dtype(model_dir: Path, wanted: str | None, device: str,
              capability: float | None) -> tuple[str, str]:
    """(dtype, reason) of the job's target (module contract); reason "" unless for_gpu
    changed the dtype asked for (or the checkpoint's, for auto)."""
    if device == "cpu":
        return FLOAT32, ""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"the target's config.json cannot be read: {exc}") from None
    return for_gpu(wanted or AUTO, checkpoint_dtype(config), capability)


def load(model_dir: Path, backend: str, device: str, dtype: str,
         aux_layer_ids: list[int] | None = None) -> Any:
    """The job's target (module contract): its ends only when vLLM captures."""
    from eaglenest.models.target import load_target, load_target_ends

    if backend == "vllm":
        return load_target_ends(model_dir, dtype=dtype, aux_layer_ids=aux_layer_ids)
    return load_target(model_dir, device=device, dtype=dtype, aux_layer_ids=aux_layer_ids)


@dataclass(frozen=True)
class StartHead:
    """What the job needs of a starting head (the `eagle_model` channel) before training."""

    kind: str
    #: the target layers it fuses (None: the target's default ones, or none read)
    aux_layer_ids: list[int] | None
    block_size: int | None  # a block head's (HeadSpec.block); else None


def start_head(init_head: Path | None) -> StartHead | None:
    """The starting head's kind, layers and block (module contract); None without one.
    InputError when the channel's config.json cannot be read as a head's."""
    if init_head is None:
        return None
    from eaglenest.models.checkpoint import read_head_config

    try:
        kind, cfg = read_head_config(init_head)
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise InputError(f"the eagle_model channel's config.json is not a draft head's: "
                         f"{type(exc).__name__}: {exc}") from None
    return StartHead(kind, list(cfg.aux_layer_ids) or None,
                     cfg.block_size if HEADS[kind].block else None)


def inherit(options: JobOptions, start: StartHead | None) -> JobOptions:
    """A job training further a block head of its own kind (EAGLENEST_HEAD names it) keeps
    that head's block unless EAGLENEST_DFLASH_BLOCK_SIZE sets one. Example: a public DFlash
    head of block 16, EAGLENEST_HEAD=dflash, no block set -> block 16 (K 7, rows 1-7)."""
    if (start is None or start.block_size is None or options.head != start.kind
            or options.dflash_block_size is not None):
        return options
    return options.model_copy(update={"dflash_block_size": start.block_size})


def release() -> bool:
    """models/target.py ``release_gpu_memory``: True when torch's GPU cache was emptied."""
    from eaglenest.models.target import release_gpu_memory

    return release_gpu_memory()


def capture_utilization(shape: ModelShape, dtype: str, gpu_bytes: float) -> float | None:
    """The vLLM capture engine's share of each GPU: memory_plan.DEFAULT_UTILIZATION less
    what the capture child itself holds on its first GPU, counted on ``gpu_bytes``:
        ends     = 2 x vocab x hidden x b          (embeddings and lm_head, untied)
        logits   = ENDS_CHUNK x vocab x (b + 4)    (a chunk's, and its float32 argmax pass)
        context  = memory_plan.FIXED_OVERHEAD
    None when the GPU's memory is unknown (vLLM's default). Example: Llama-3.1-8B (vocab
    128256, hidden 4096) in bfloat16 on an H100 (80 GiB, 72 counted): 0.90 - 3.3 / 72
    = 0.854."""
    if not gpu_bytes:
        return None
    b = BYTES[dtype]
    own = (2 * shape.vocab * shape.hidden * b + ENDS_CHUNK * shape.vocab * (b + 4)
           + FIXED_OVERHEAD)
    return round(max(0.05, DEFAULT_UTILIZATION - own / gpu_bytes), 4)


def vllm_capture(model_dir: Path, device: str, dtype: str, gpus: JobGpus, max_model_len: int,
                 work: Path, children_dir: Path | None, resource: str) -> VllmCapture:
    """The vLLM children's engine (module contract): on the CPU one process in float32; on
    CUDA the job's dtype over the largest degree of the job's GPUs the heads allow."""
    if device == "cpu":
        return VllmCapture(model_dir, "cpu", 1, max_model_len, work, children_dir, resource,
                           gpus.env, FLOAT32)
    shape = shape_of(model_dir)
    tp = tensor_parallel(shape, len(gpus.indexes))
    if tp < len(gpus.indexes):
        log.info("vLLM runs %s tensor parallel over %d of the job's %d GPUs: %d attention "
                 "heads, %d KV heads", shape.architecture, tp, len(gpus.indexes),
                 shape.heads, shape.kv_heads)
    share = capture_utilization(shape, dtype, gpus.memory_gib * MEMORY_TOLERANCE * GIB)
    return VllmCapture(model_dir, "cuda", tp, max_model_len, work, children_dir, resource,
                       gpus.env, dtype, share)


def export(folder: Path, dtype: str) -> None:
    """The trained head in ``folder`` in ``dtype`` (models/checkpoint.py ``export_head``);
    nothing when training wrote no head there."""
    from eaglenest.models.checkpoint import WEIGHTS, export_head

    if (folder / WEIGHTS).is_file():
        export_head(folder, dtype)
