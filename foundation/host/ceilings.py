"""Ceilings on the options that multiply what a caller's request costs the host (threads,
training processes, tokens, steps), in one place: checked when CreateModel and
CreateOptimizationJob store them (db/) and read again, with the same parsing, by the worker
that starts the processes (workers/), so a value accepted at Create is never read
differently later. docs/security.md ("Ceilings") says why each limit is what it is.

Contract:
- Thread counts (`THREAD_OPTIONS`: OMP_NUM_THREADS, MKL_NUM_THREADS,
  EAGLENEST_TORCH_THREADS) are whole numbers of ASCII digits, at least 1 (`read_threads`:
  "2,512" is libgomp's nested levels, 512 threads at the second; foundation/host/threads.py
  refuses anything else too), and at most the usable CPUs. At Create that is the API
  host's (`host_cpus`, a proxy: the workers are usually the same machines or larger); a
  worker with fewer clamps each one to its own usable CPUs before it starts a model server
  (`clamp_threads`, called by workers/model_servers/process.thread_env; foundation/host/threads.py
  plan_threads then sizes the pools from the clamped value).
- Serving lengths (`LENGTH_OPTIONS`: EAGLENEST_MAX_MODEL_LEN, OPTION_MAX_MODEL_LEN,
  MAX_TOTAL_TOKENS, MAX_INPUT_LENGTH) are at most `MAX_MODEL_LEN` tokens, at Create and
  when the worker deploys (`check_length`).
- Job options (`JOB_RANGES`: EAGLENEST_BATCH_SIZE, EAGLENEST_MAX_LENGTH, EAGLENEST_MAX_STEPS,
  EAGLENEST_TRAIN_PROCESSES) are parsed by `parse_int` in foundation/job_options.py, the one
  parser of CreateOptimizationJob and the worker; EAGLENEST_TRAIN_PROCESSES is also at most
  the GPUs of the job's DeploymentInstanceType (`check_train_processes`; the worker checks
  it against the GPUs it placed).
- A model's Environment maps hold at most MAX_ENVIRONMENT_BYTES together
  (`check_environment_size`, CreateModel, as SageMaker documents).
- Every refusal names the variable and the limit (`LimitError`).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping

#: thread-pool sizes a model server reads (OpenMP, MKL, torch intra-op)
THREAD_OPTIONS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "EAGLENEST_TORCH_THREADS")
#: a model's max length in tokens (prompt plus output), and TGI's longest prompt
LENGTH_OPTIONS = ("EAGLENEST_MAX_MODEL_LEN", "OPTION_MAX_MODEL_LEN", "MAX_TOTAL_TOKENS",
                  "MAX_INPUT_LENGTH")
#: the longest context of the open targets EagleNest serves (Llama 3.1, Qwen2.5: 128K); a
#: model server's KV cache and the prompt check are sized by it
MAX_MODEL_LEN = 131_072
MAX_BATCH_SIZE = 256
MAX_SAMPLE_TOKENS = 32_768
MAX_STEPS = 1_000_000
#: the most torchrun ranks any option allows (the largest instance type has 8 GPUs)
MAX_TRAIN_PROCESSES = 64
#: job option -> (least, most); workers/jobs/options.py reads these ranges
JOB_RANGES: dict[str, tuple[int, int]] = {
    "EAGLENEST_BATCH_SIZE": (1, MAX_BATCH_SIZE),
    "EAGLENEST_MAX_LENGTH": (16, MAX_SAMPLE_TOKENS),
    "EAGLENEST_MAX_STEPS": (1, MAX_STEPS),
    "EAGLENEST_TRAIN_PROCESSES": (1, MAX_TRAIN_PROCESSES),
}
_LEADING = re.compile(r"\s*\+?([0-9]+)")

#: SageMaker's bound on what a CreateModel's Environment maps hold: all the keys and values of
#: all its containers together (botocore's ContainerDefinition.Environment: "32 KB"; each
#: map 100 entries of 1024-character keys and values, which the request shapes check)
MAX_ENVIRONMENT_BYTES = 32 * 1024


class LimitError(ValueError):
    """A value out of its option's range; the message names the variable and the limit."""


def host_cpus() -> int:
    """The CPUs this process may run on (its affinity): the API host's, at Create."""
    return len(os.sched_getaffinity(0))


def parse_int(name: str, raw: str, lo: int, hi: int) -> int:
    """`raw` read as Python's int() reads it, within lo..hi; LimitError otherwise."""
    try:
        value = int(raw)
    except ValueError:
        raise LimitError(f"{name}={raw!r} is not an integer") from None
    if not lo <= value <= hi:
        raise LimitError(f"{name}={value} must be between {lo} and {hi}")
    return value


def _whole(raw: str) -> int | None:
    """The largest number any reader may take `raw` for: Python's int() (torch's plan,
    the worker's parsers: Unicode digits, '_', a sign) or C's strtoul on its leading
    digits (libgomp, MKL: "512,512" is 512 threads). None: no reader takes it for a number
    (the worker refuses it, naming it). Digits past 18 are over any limit."""
    readings = []
    lead = _LEADING.match(raw)
    if lead:
        digits = lead.group(1)
        readings.append(int(digits) if len(digits) <= 18 else 10**18)
    with contextlib.suppress(ValueError):
        readings.append(int(raw))
    return max(readings) if readings else None


def read_threads(name: str, raw: str) -> int:
    """A thread count as every reader takes it alike (module contract); LimitError naming
    the variable otherwise."""
    if not (raw.isascii() and raw.isdigit()) or int(raw[:19]) < 1:
        raise LimitError(f"{name}={raw[:40]!r} must be a whole number >= 1 (digits only: a "
                         f"list such as '2,512' sets OpenMP's nested thread pools)")
    return int(raw) if len(raw) <= 18 else 10**18  # past 18 digits: over any limit


def check_threads(name: str, raw: str, cpus: int, where: str = "the API host") -> None:
    """At most `cpus`, then `read_threads` (an empty value is unset, as for the worker)."""
    if not raw:
        return
    value = _whole(raw)
    if value is not None and value > cpus:
        raise LimitError(f"{name}={raw.strip()} is over its limit: at most {cpus}, the usable "
                         f"CPUs of {where} (more threads than CPUs only wait for each other)")
    read_threads(name, raw)


def check_length(name: str, raw: str) -> None:
    value = _whole(raw)
    if value is not None and value > MAX_MODEL_LEN:
        raise LimitError(f"{name}={raw.strip()} is over its limit: at most {MAX_MODEL_LEN} "
                         f"tokens (EagleNest's longest max model length)")


def check_model_environment(env: Mapping[str, str] | None, where: str, cpus: int) -> None:
    """CreateModel: a container's thread counts and lengths (LimitError naming `where`)."""
    for name, raw in sorted((env or {}).items()):
        try:
            if name in THREAD_OPTIONS:
                check_threads(name, str(raw), cpus)
            elif name in LENGTH_OPTIONS:
                check_length(name, str(raw))
        except LimitError as exc:
            raise LimitError(f"Environment variable {exc} (in {where}).") from None


def check_environment_size(envs: Mapping[str, Mapping[str, str] | None]) -> None:
    """CreateModel: the keys and values of every container's Environment (`envs`: where ->
    map), in UTF-8 bytes, at most MAX_ENVIRONMENT_BYTES together."""
    total = sum(len(str(k).encode()) + len(str(v).encode())
                for env in envs.values() for k, v in (env or {}).items())
    if total > MAX_ENVIRONMENT_BYTES:
        where = ", ".join(w for w, env in envs.items() if env)
        raise LimitError(f"{where}: the keys and values of a model's Environment maps total "
                         f"{total} bytes; at most {MAX_ENVIRONMENT_BYTES} (32 KB) for all of "
                         "its containers together, as SageMaker allows.")


def check_train_processes(value: int, gpus: int, instance_type: str) -> None:
    """Ranks: one per GPU at most (each takes a GPU of its own)."""
    if gpus and value > gpus:
        raise LimitError(f"EAGLENEST_TRAIN_PROCESSES={value} is more than the {gpus} GPU(s) "
                         f"of {instance_type}")


def clamp_threads(env: Mapping[str, str], cpus: int) -> dict[str, str]:
    """The worker's re-check: each thread count of `env` above `cpus`, set to `cpus` (the
    entries to override; empty when none is over); LimitError for one no reader takes
    alike (`read_threads`: a row stored before Create refused it)."""
    over = {}
    for name in THREAD_OPTIONS:
        if env.get(name) and read_threads(name, str(env[name])) > cpus:
            over[name] = str(cpus)
    return over


def job_instances(env: Mapping[str, str] | None, gpus: int) -> int:
    """What a job holds against the account's instance quota: one per GPU of its type, or
    per training process when it asks for more (an unreadable value: none more)."""
    raw = (env or {}).get("EAGLENEST_TRAIN_PROCESSES")
    try:
        ranks = parse_int("EAGLENEST_TRAIN_PROCESSES", str(raw), 1, MAX_TRAIN_PROCESSES)
    except LimitError:
        ranks = 1
    return max(1, gpus, ranks)
