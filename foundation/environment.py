"""The environment of the processes EagleNest starts for a caller: model servers (endpoints,
a job's benchmark stage) and training processes (torchrun and its ranks).

Contract (docs/security.md):
- A child starts from `child_environment()`: the few host variables in `FROM_HOST` (PATH,
  HOME, locale, TMPDIR, GPU visibility and library paths, vLLM's CPU sizing: set by the
  operator, never by a caller) plus `FIXED` (offline model loading, unbuffered output),
  then the caller's allowed entries. Never the worker's own environment: no access key,
  database or broker URL, S3 credential or other setting of the control plane reaches it.
- A caller's `Environment` / `OptimizationEnvironment` entry is accepted only when its name
  is in `ALLOWED` (EagleNest's documented job and serving options, LMI options it reads,
  thread counts) and its value holds no NUL. Anything else (PYTHONPATH, LD_PRELOAD,
  PYTHONWARNINGS, BROWSER, HF_HUB_OFFLINE, VLLM_*, OPTION_TRUST_REMOTE_CODE...) can make a
  Python or vLLM process load code or reach the network, so it is refused at Create time
  (`check_user_environment`, a ValidationException naming the variable) and again before a
  process starts (`EnvironmentRejected`), for rows stored before the rule existed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: optimization-job options (workers/jobs/options.py; README "Job options")
JOB_OPTIONS = frozenset({
    "EAGLENEST_HEAD", "EAGLENEST_MAX_STEPS", "EAGLENEST_BATCH_SIZE", "EAGLENEST_LEARNING_RATE",
    "EAGLENEST_SEED", "EAGLENEST_MAX_LENGTH", "EAGLENEST_DRAFT_VOCAB_SIZE",
    "EAGLENEST_NUM_LAYERS", "EAGLENEST_CHECKPOINT_EVERY", "EAGLENEST_DATASET",
    "EAGLENEST_REGENERATE", "EAGLENEST_HOLDOUT", "EAGLENEST_BENCHMARK",
    "EAGLENEST_BENCH_CONCURRENCY", "EAGLENEST_BENCH_MAX_TOKENS",
    "EAGLENEST_NUM_SPECULATIVE_TOKENS", "EAGLENEST_SERVING_BACKEND", "EAGLENEST_DEVICE",
    "EAGLENEST_TRAIN_PROCESSES", "EAGLENEST_BENCH_KS", "EAGLENEST_PROGRESS_EVERY",
})
#: serving options (workers/serving/deploy.py; README "Serving options"), the LMI options
#: deploy.py reads as their equivalents, and thread counts
SERVING_OPTIONS = frozenset({
    "EAGLENEST_SERVING_BACKEND", "EAGLENEST_NUM_SPECULATIVE_TOKENS", "EAGLENEST_DECODE_MODE",
    "EAGLENEST_ADAPTIVE", "EAGLENEST_MAX_MODEL_LEN", "EAGLENEST_DTYPE",
    "EAGLENEST_SPECULATION_SCHEDULE", "EAGLENEST_EXPECTED_CONCURRENCY", "EAGLENEST_TORCH_THREADS",
    "EAGLENEST_SPLIT_SERVING",
    "OPTION_MAX_MODEL_LEN", "OPTION_DTYPE", "OPTION_TENSOR_PARALLEL_DEGREE",
    "OPTION_MAX_ROLLING_BATCH_SIZE",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM",
})
ALLOWED = JOB_OPTIONS | SERVING_OPTIONS

#: copied from the worker's environment when set (the operator's, not a caller's)
FROM_HOST = ("PATH", "HOME", "LANG", "LANGUAGE", "TMPDIR", "TZ", "USER", "LOGNAME",
             "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "LD_LIBRARY_PATH",
             "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
             "OMP_NUM_THREADS", "MKL_NUM_THREADS", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
             "EAGLENEST_TORCH_THREADS", "EAGLENEST_COMPUTE_REGISTRY")
FIXED = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
         "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1"}
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


class EnvironmentRejected(ValueError):
    """A caller's variable that may not reach a process; the message names it."""


def rejection(name: str, value: str, where: str) -> str | None:
    """Why `name=value` may not be set in `where` (a member path), or None when it may."""
    if name not in ALLOWED:
        return (f"Environment variable {name} in {where} is not allowed: EagleNest passes "
                f"only its documented serving and job options (EAGLENEST_*, the LMI options "
                f"OPTION_MAX_MODEL_LEN, OPTION_DTYPE, OPTION_TENSOR_PARALLEL_DEGREE, "
                f"OPTION_MAX_ROLLING_BATCH_SIZE, and thread counts); see docs/security.md.")
    if "\x00" in value:
        return f"Environment variable {name} in {where} holds a NUL character."
    return None


def check(env: Mapping[str, str] | None, where: str) -> None:
    """Raise EnvironmentRejected for the first entry of `env` that is not allowed."""
    for name, value in sorted((env or {}).items()):
        reason = rejection(name, str(value), where)
        if reason:
            raise EnvironmentRejected(reason)


def child_environment(user: Mapping[str, str] | None = None,
                      **fixed: str) -> dict[str, str]:
    """The environment of a child process: host basics, FIXED, `fixed`, then the caller's
    allowed entries (EnvironmentRejected for any other)."""
    check(user, "Environment")
    env = {k: os.environ[k] for k in FROM_HOST if k in os.environ}
    env.update({k: v for k, v in os.environ.items() if k.startswith("LC_")})
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(FIXED)
    env.update(fixed)
    env.update(user or {})
    return env
