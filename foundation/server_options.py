"""A model container's Environment read as a memory plan's wishes (foundation/memory_plan.py
`Wants`): one reader for CreateEndpoint's check and the worker's deploy, so both refuse the
same values with the same words.

Contract, `wants(env)`:
- dtype: the first of DTYPE_OPTIONS that is set, any spelling foundation/dtypes.py accepts
  (``fp16``, ``bf16`` ...); else ``auto``.
- tensor parallel: the first of TP_OPTIONS that is set (LMI, then TGI / SageMaker names):
  a positive integer, or ``max``: every GPU the instance holds (`ServerOptions.max_tp`).
  Unset: the plan's default degree (memory_plan.tensor_parallel).
- max model length: the first of MAX_LEN_OPTIONS that is set (EagleNest's, LMI's, TGI's
  prompt + output); MAX_INPUT_LENGTH (TGI's longest prompt), when set, must be below it
  (below CPU_MAX_MODEL_LEN when no length is set; the caller checks it again against the
  plan's length).
- OPTION_MAX_ROLLING_BATCH_SIZE: vLLM's --max-num-seqs and the embedded engine's batch.
- OPTION_GPU_MEMORY_UTILIZATION: vLLM's --gpu-memory-utilization, in (0, 1].
Each bad value raises `OptionError` naming the variable.

`check_container(env, modes, default_backend)`: every option a model server reads from its
container, checked by CreateModel and by the worker's deploy with this one function: `read`
above, then EAGLENEST_SERVING_BACKEND (vllm or embedded), EAGLENEST_DECODE_MODE (one of
`modes`: the worker passes models/decode/modes.py's; Create, which does not import models,
passes None and leaves the name to the worker), EAGLENEST_ADAPTIVE and
EAGLENEST_SPLIT_SERVING (0 or 1; adaptive needs the embedded backend, when the backend is
known: set, or the worker's default), EAGLENEST_NUM_SPECULATIVE_TOKENS (1..64) and
EAGLENEST_EXPECTED_CONCURRENCY (1..4096).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from eaglenest.foundation.dtypes import AUTO, DtypeError, normalize
from eaglenest.foundation.host.ceilings import LimitError, check_length
from eaglenest.foundation.memory_plan import (
    CPU_MAX_MODEL_LEN,
    Gpus,
    HeadShape,
    MemoryPlan,
    ModelShape,
    PlanError,
    Wants,
    plan,
)

DTYPE_OPTIONS = ("EAGLENEST_DTYPE", "OPTION_DTYPE")
#: LMI / TGI / SageMaker names for the tensor-parallel degree, in order of precedence
TP_OPTIONS = ("OPTION_TENSOR_PARALLEL_DEGREE", "TENSOR_PARALLEL_DEGREE", "SM_NUM_GPUS")
#: the model's max length, in this precedence: EagleNest's, LMI's, TGI's (prompt + output)
MAX_LEN_OPTIONS = ("EAGLENEST_MAX_MODEL_LEN", "OPTION_MAX_MODEL_LEN", "MAX_TOTAL_TOKENS")
PROMPT_OPTION = "MAX_INPUT_LENGTH"
BATCH_OPTION = "OPTION_MAX_ROLLING_BATCH_SIZE"
MEMORY_OPTION = "OPTION_GPU_MEMORY_UTILIZATION"
#: the most sequences a server runs at once (vLLM's own ceiling is far above any GPU's)
MAX_BATCH = 4096


class OptionError(ValueError):
    """A container option that cannot be read; the message names it."""


@dataclass(frozen=True)
class ServerOptions:
    wants: Wants
    #: TP asked as ``max``: every GPU the instance holds
    max_tp: bool = False
    #: MAX_INPUT_LENGTH: the longest prompt a request may send (None: max model length)
    max_input_length: int | None = None


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        raw = (env.get(name) or "").strip()
        if raw:
            return name, raw
    return None


def _positive(name: str, raw: str, most: int | None = None) -> int:
    """A positive integer; over `most` (None: EagleNest's longest max model length)
    refused with foundation/host/ceilings.py's words, as CreateModel refuses it."""
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise OptionError(f"{name}={raw!r} must be a positive integer")
    if most is None:
        try:
            check_length(name, raw)
        except LimitError as exc:
            raise OptionError(str(exc)) from None
    elif int(raw) > most:
        raise OptionError(f"{name}={raw} is over its limit: at most {most}")
    return int(raw)


def _dtype(env: Mapping[str, str]) -> str:
    found = _first(env, DTYPE_OPTIONS)
    if found is None:
        return AUTO
    try:
        return normalize(found[1], found[0])
    except DtypeError as exc:
        raise OptionError(str(exc)) from None


def _utilization(env: Mapping[str, str]) -> float | None:
    raw = (env.get(MEMORY_OPTION) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise OptionError(f"{MEMORY_OPTION}={raw!r} must be a number in (0, 1]")
    return value


def read(env: Mapping[str, str]) -> ServerOptions:
    """The container's wishes (module contract); OptionError naming a bad variable."""
    tp, tp_name, max_tp = None, TP_OPTIONS[0], False
    found = _first(env, TP_OPTIONS)
    if found is not None:
        tp_name, raw = found
        if raw.lower() == "max":
            max_tp = True
        elif not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
            raise OptionError(f"{tp_name}={raw!r} must be a positive integer or max")
        else:
            tp = _positive(tp_name, raw, 64)
    length, len_name = None, MAX_LEN_OPTIONS[0]
    found = _first(env, MAX_LEN_OPTIONS)
    if found is not None:
        len_name, raw = found
        length = _positive(len_name, raw)
    prompt = None
    raw_prompt = env.get(PROMPT_OPTION)
    if raw_prompt is not None:
        bound = length or CPU_MAX_MODEL_LEN
        if not (raw_prompt.isascii() and raw_prompt.isdigit()
                and 1 <= int(raw_prompt) < bound):
            raise OptionError(f"{PROMPT_OPTION}={raw_prompt!r} must be a positive integer "
                              f"below the max model length, {bound} ({len_name})")
        prompt = int(raw_prompt)
    batch = None
    raw_batch = (env.get(BATCH_OPTION) or "").strip()
    if raw_batch:
        batch = _positive(BATCH_OPTION, raw_batch, MAX_BATCH)
    return ServerOptions(
        Wants(dtype=_dtype(env), tensor_parallel=tp, tp_variable=tp_name,
              max_model_len=length, len_variable=len_name, max_num_seqs=batch,
              gpu_memory_utilization=_utilization(env)),
        max_tp=max_tp, max_input_length=prompt)


def plan_for(options: ServerOptions, shape: ModelShape, gpus: Gpus,
             head: HeadShape | None = None, copies: int = 1) -> MemoryPlan:
    """The plan of one server of `copies` on `gpus` as the container asks (``max``: every
    GPU); PlanError when it cannot hold, MAX_INPUT_LENGTH not below its length included.
    CreateEndpoint (db/gpu_fit.py) and the worker (workers/model_servers/gpu_options.py) both
    plan with this."""
    wants = replace(options.wants, copies=copies,
                    tensor_parallel=gpus.count if options.max_tp
                    else options.wants.tensor_parallel)
    planned = plan(shape, gpus, wants, head)
    prompt = options.max_input_length
    if prompt is not None and prompt >= planned.max_model_len:
        raise PlanError(f"{PROMPT_OPTION}={prompt} must be below the max model length, "
                        f"{planned.max_model_len}")
    return planned


#: EAGLENEST_SERVING_BACKEND's values (workers/model_servers/process.py VLLM, EMBEDDED)
SERVING_BACKENDS = ("vllm", "embedded")
#: the decode mode a server runs when none is set (models/decode/modes.py DecodeMode.CHAIN)
DEFAULT_MODE = "chain"


@dataclass(frozen=True)
class ContainerOptions:
    """What a model server reads of its container's Environment (`check_container`)."""

    server: ServerOptions
    #: EAGLENEST_SERVING_BACKEND, else the worker's default (None: not known at Create)
    backend: str | None
    mode: str
    adaptive: bool
    split: bool
    #: EAGLENEST_NUM_SPECULATIVE_TOKENS (None: the head's provenance, else 5)
    speculative_tokens: int | None
    expected_concurrency: int


def _flag(env: Mapping[str, str], name: str, default: str) -> bool:
    raw = env.get(name, default)
    if raw not in ("0", "1"):
        raise OptionError(f"{name}={raw!r} must be 0 or 1")
    return raw == "1"


def _ranged(name: str, raw: str, lo: int, hi: int) -> int:
    if not (raw.isascii() and raw.isdigit()) or not lo <= int(raw[:19]) <= hi:
        raise OptionError(f"{name}={raw!r} must be {lo}..{hi}")
    return int(raw)


def check_container(env: Mapping[str, str], modes: tuple[str, ...] | None = None,
                    default_backend: str | None = None) -> ContainerOptions:
    """A container's options (module contract); OptionError naming the first bad one."""
    backend = env.get("EAGLENEST_SERVING_BACKEND") or default_backend
    if backend is not None and backend not in SERVING_BACKENDS:
        raise OptionError(f"EAGLENEST_SERVING_BACKEND={backend!r} must be vllm or embedded")
    mode = env.get("EAGLENEST_DECODE_MODE", DEFAULT_MODE)
    if modes is not None and mode not in modes:
        *first, last = modes
        raise OptionError(f"EAGLENEST_DECODE_MODE={mode!r} must be {', '.join(first)} or {last}")
    adaptive = _flag(env, "EAGLENEST_ADAPTIVE", "0")
    split = _flag(env, "EAGLENEST_SPLIT_SERVING", "1")
    if adaptive and backend is not None and backend != SERVING_BACKENDS[1]:
        raise OptionError("EAGLENEST_ADAPTIVE=1 needs EAGLENEST_SERVING_BACKEND=embedded "
                          "(vLLM drafts a fixed num_speculative_tokens)")
    raw_k = env.get("EAGLENEST_NUM_SPECULATIVE_TOKENS")
    k = _ranged("EAGLENEST_NUM_SPECULATIVE_TOKENS", raw_k, 1, 64) if raw_k else None
    load = _ranged("EAGLENEST_EXPECTED_CONCURRENCY",
                   env.get("EAGLENEST_EXPECTED_CONCURRENCY", "1"), 1, 4096)
    return ContainerOptions(read(env), backend, mode, adaptive, split, k, load)
