"""The dtypes users send, and the one a GPU can run (docs/gpu-memory.md).

Contract:
- `normalize(raw, variable)` maps every spelling LMI, TGI and vLLM users write (``fp16``,
  ``float16``, ``half``, ``bf16``, ``bfloat16``, ``fp32``, ``float32``, ``float``, ``auto``;
  any case, surrounding blanks ignored) to one internal value: ``float16``, ``bfloat16``,
  ``float32`` or ``auto``. Anything else raises `DtypeError`, whose message names the
  variable and the allowed spellings.
- `for_gpu(wanted, checkpoint, capability)` is the dtype a process runs in on a GPU of
  compute `capability`: ``auto`` means the checkpoint's own dtype, except float32, which
  runs in half precision on a GPU (as vLLM's ``auto`` does); bfloat16 needs compute
  capability 8.0 or more (A10G, L4, L40S, A100, H100, H200: yes; T4, V100: no) and
  becomes float16 below it, with the reason returned beside it.
- `BYTES[dtype]` is the bytes one value takes.
Plain data: no torch import.
"""

from __future__ import annotations

FLOAT16, BFLOAT16, FLOAT32, AUTO = "float16", "bfloat16", "float32", "auto"

#: every accepted spelling -> the internal value
SPELLINGS = {
    "fp16": FLOAT16, "float16": FLOAT16, "half": FLOAT16,
    "bf16": BFLOAT16, "bfloat16": BFLOAT16,
    "fp32": FLOAT32, "float32": FLOAT32, "float": FLOAT32,
    "auto": AUTO,
}
BYTES = {FLOAT16: 2, BFLOAT16: 2, FLOAT32: 4}
#: the least compute capability that runs bfloat16 (NVIDIA Ampere)
BF16_CAPABILITY = 8.0


class DtypeError(ValueError):
    """A dtype nobody accepts; the message names the variable and the allowed values."""


def normalize(raw: str, variable: str = "dtype") -> str:
    """The internal value of `raw` (one of SPELLINGS); DtypeError naming `variable`."""
    value = SPELLINGS.get(str(raw).strip().lower())
    if value is None:
        allowed = ", ".join(SPELLINGS)
        raise DtypeError(f"{variable}={raw!r} is not a dtype EagleNest accepts; use one of "
                         f"{allowed}")
    return value


def checkpoint_dtype(config: dict[str, object]) -> str:
    """The dtype a checkpoint's config.json says it was saved in (``torch_dtype``, or
    transformers 5's ``dtype``); bfloat16 when it names none or an unknown one."""
    text = config.get("text_config")
    own = text if isinstance(text, dict) else config
    for key in ("torch_dtype", "dtype"):
        raw = own.get(key) or config.get(key)
        if isinstance(raw, str) and SPELLINGS.get(raw.lower()) in BYTES:
            return SPELLINGS[raw.lower()]
    return BFLOAT16


def for_gpu(wanted: str, checkpoint: str, capability: float | None) -> tuple[str, str]:
    """(dtype, reason) for a process on a GPU of compute `capability` (None: unknown,
    taken as able to run bfloat16); `reason` is "" unless the dtype was changed."""
    dtype = wanted if wanted != AUTO else checkpoint
    reason = ""
    if wanted == AUTO and dtype == FLOAT32:
        dtype = BFLOAT16  # vLLM's auto: a float32 checkpoint runs in half precision on GPUs
    if dtype == BFLOAT16 and capability is not None and capability < BF16_CAPABILITY:
        dtype = FLOAT16
        reason = (f"bfloat16 needs compute capability {BF16_CAPABILITY:g} or more; this GPU "
                  f"has {capability:g}, so the model runs in float16")
    return dtype, reason
