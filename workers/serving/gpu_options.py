"""What an endpoint instance's GPUs mean for its model server (docs/gpu-hosts.md).

Contract, for an instance that holds `gpus` (workers/infra/placement.py):
- vLLM's --tensor-parallel-size is the instance's GPUs, or less where the container says so
  as LMI / TGI / SageMaker containers do (SM_NUM_GPUS, OPTION_TENSOR_PARALLEL_DEGREE,
  TENSOR_PARALLEL_DEGREE; ``max`` = all); more than the instance holds is refused (the
  instance still holds all of its type's GPUs, as on SageMaker).
- OPTION_GPU_MEMORY_UTILIZATION becomes vLLM's --gpu-memory-utilization (0 < x <= 1).
- On CUDA the dtype defaults to the model's own (vLLM ``auto``; the embedded engine reads
  config.json), as vLLM and LMI do; float32 stays the CPU default (and is exact).
- Split serving (a second copy of the target beside the speculating one) is off on CUDA
  unless EAGLENEST_SPLIT_SERVING=1 asks for it and the instance's GPUs hold both copies with
  room to spare: vLLM's own dynamic speculation already serves every load there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from eaglenest.workers.serving.process import EMBEDDED, ServerSpec

log = logging.getLogger("eaglenest.endpoints")
#: LMI / TGI / SageMaker names for the tensor-parallel degree, in order of precedence
TP_OPTIONS = ("OPTION_TENSOR_PARALLEL_DEGREE", "TENSOR_PARALLEL_DEGREE", "SM_NUM_GPUS")
MEMORY_OPTION = "OPTION_GPU_MEMORY_UTILIZATION"
#: split serving needs both copies of the weights in at most this share of the GPUs' memory
SPLIT_MEMORY_SHARE = 0.5
_DTYPES = ("bfloat16", "float16", "float32")


class GpuOptionError(ValueError):
    """An option that cannot hold on the instance's GPUs; the message names it."""


def tensor_parallel(env: Mapping[str, str], gpus: int) -> int:
    """The tensor-parallel degree for an instance of `gpus` GPUs (1 on the CPU)."""
    for name in TP_OPTIONS:
        raw = (env.get(name) or "").strip()
        if not raw:
            continue
        if raw.lower() == "max":
            return max(1, gpus)
        if not raw.isdigit() or int(raw) < 1:
            raise GpuOptionError(f"{name}={raw!r} must be a positive integer or max")
        if gpus and int(raw) > gpus:
            raise GpuOptionError(f"{name}={raw} asks for more GPUs than the instance holds "
                                 f"({gpus})")
        return int(raw) if gpus else 1
    return max(1, gpus)


def memory_utilization(env: Mapping[str, str]) -> float | None:
    raw = (env.get(MEMORY_OPTION) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise GpuOptionError(f"{MEMORY_OPTION}={raw!r} must be a number in (0, 1]")
    return value


def model_dtype(model_dir: Path) -> str:
    """The dtype the checkpoint was saved in (config.json), bfloat16 when it says none."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return "bfloat16"
    found = str(config.get("torch_dtype") or config.get("dtype") or "")
    return found if found in _DTYPES else "bfloat16"


def _weights_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))


def apply(spec: ServerSpec, env: Mapping[str, str], gpus: list[int], gpu_env: dict[str, str],
          memory_gib: float, cuda: bool) -> None:
    """Set `spec`'s GPU view, parallelism, memory share, dtype and split for `gpus` (GPUs
    of `memory_gib` each; `cuda`: the host really has CUDA, not a declared inventory)."""
    spec.gpu_env, spec.gpus = dict(gpu_env), list(gpus)
    spec.tensor_parallel = tensor_parallel(env, len(gpus))
    spec.gpu_memory_utilization = memory_utilization(env)
    if not (gpus and cuda):
        return
    if not (env.get("EAGLENEST_DTYPE") or env.get("OPTION_DTYPE")):
        spec.dtype = model_dtype(spec.model_dir) if spec.backend == EMBEDDED else "auto"
    asked = env.get("EAGLENEST_SPLIT_SERVING") == "1"
    room = SPLIT_MEMORY_SHARE * memory_gib * len(gpus) * 2**30
    spec.split = asked and 2 * _weights_bytes(spec.model_dir) <= room
    if asked and not spec.split:
        log.warning("split serving turned off: two copies of %s do not fit in %.0f%% of "
                    "the instance's %d GPU(s)", spec.model_dir, 100 * SPLIT_MEMORY_SHARE,
                    len(gpus))
