"""What an instance's GPUs mean for its model server (docs/gpu-memory.md, docs/gpu-hosts.md).

Contract, for a server placed on `gpus` (workers/infra/placement.py) of an instance type
described by `held` (foundation/memory_plan.gpus_of_type):
- `apply` plans the server from its model folder alone (foundation/memory_plan.py: the
  weights in the dtype it will load, the head, the overhead, the KV cache) before it
  starts, and sets the spec from the plan: --tensor-parallel-size (the container's
  SM_NUM_GPUS / OPTION_TENSOR_PARALLEL_DEGREE / TENSOR_PARALLEL_DEGREE where set and valid,
  else the largest degree that divides the model's heads), --gpu-memory-utilization
  (OPTION_GPU_MEMORY_UTILIZATION where set, else the plan's), --max-model-len (the
  container's where set and it fits, else the model's own bounded by the KV cache),
  --max-num-seqs (OPTION_MAX_ROLLING_BATCH_SIZE). A model that cannot fit, or an option that
  cannot hold, raises GpuOptionError naming the sizes or the variable: the caller fails
  the endpoint (or job) before any server starts.
- The dtype: on CUDA, the plan's (the checkpoint's own, float16 below compute capability
  8.0, or the container's EAGLENEST_DTYPE / OPTION_DTYPE in any spelling LMI users write);
  with a declared inventory on a host without CUDA (tests), the CPU's (float32 unless the
  container asks), while every other figure is the GPU plan's.
- Split serving (a second copy of the target beside the speculating one) on CUDA only
  where EAGLENEST_SPLIT_SERVING=1 asks for it and the plan fits twice: each server then
  gets half the memory share (the plan of two copies). vLLM's own dynamic speculation
  serves every load otherwise.
- No GPUs: the spec keeps the CPU's settings (deploy.py) and nothing is planned.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from eaglenest.foundation import server_options
from eaglenest.foundation.memory_plan import (
    Gpus,
    MemoryPlan,
    PlanError,
    ShapeError,
    head_of,
    shape_of,
)
from eaglenest.workers.model_servers.process import ServerSpec

log = logging.getLogger("eaglenest.endpoints")


class GpuOptionError(ValueError):
    """An option that cannot hold on the instance's GPUs, or a model that does not fit
    them; the message names the variable or the sizes."""


def plan_server(spec: ServerSpec, env: Mapping[str, str], held: Gpus,
                copies: int = 1) -> MemoryPlan:
    """The plan of `spec`'s server on `held` (`copies` servers sharing the GPUs);
    GpuOptionError when it cannot hold."""
    try:
        options = server_options.read(env)
        head = head_of(spec.head_dir) if spec.head_dir is not None else None
        return server_options.plan_for(options, shape_of(spec.model_dir), held, head, copies)
    except (server_options.OptionError, PlanError, ShapeError) as exc:
        raise GpuOptionError(str(exc)) from None


def apply(spec: ServerSpec, env: Mapping[str, str], gpus: list[int], gpu_env: dict[str, str],
          held: Gpus, cuda: bool) -> MemoryPlan | None:
    """Set `spec`'s GPU view and, on GPUs, its plan (module contract). `held`: the GPUs of
    the instance type, `gpus` the worker's indexes of those this server holds; `cuda`: the
    host really has CUDA, not a declared inventory. The plan, None without GPUs."""
    spec.gpu_env, spec.gpus = dict(gpu_env), list(gpus)
    if not gpus:
        return None
    held = replace(held, count=len(gpus))
    planned = plan_server(spec, env, held)
    if cuda:
        spec.split = spec.split and _split_fits(spec, env, held)
        if spec.split and spec.split_upto() is not None:
            planned = plan_server(spec, env, held, copies=2)  # each server half the share
        spec.dtype = planned.dtype
        if planned.dtype_reason:
            log.warning("%s: %s", spec.model_dir, planned.dtype_reason)
    spec.tensor_parallel = planned.tensor_parallel
    spec.gpu_memory_utilization = planned.gpu_memory_utilization
    spec.max_model_len = planned.max_model_len
    spec.max_num_seqs = planned.max_num_seqs
    log.info("%s on %d GPU(s): %s", spec.model_dir, len(gpus), planned.describe())
    return planned


def _split_fits(spec: ServerSpec, env: Mapping[str, str], held: Gpus) -> bool:
    """Split serving on GPUs: asked for (EAGLENEST_SPLIT_SERVING=1) and planned twice."""
    if env.get("EAGLENEST_SPLIT_SERVING") != "1":
        return False
    try:
        plan_server(spec, env, held, copies=2)
    except GpuOptionError as exc:
        log.warning("split serving turned off: two servers of %s do not fit the instance's "
                    "GPUs: %s", spec.model_dir, exc)
        return False
    return True
