"""The environment of the processes EagleNest starts for a caller: model servers (endpoints,
a job's benchmark stage) and training processes (torchrun and its ranks).

Contract (docs/security.md):
- A child starts from `child_environment()`: the few host variables in `FROM_HOST` (PATH,
  HOME, locale, TMPDIR, GPU visibility and library paths, vLLM's CPU sizing: set by the
  operator, never by a caller) plus `FIXED` (offline model loading, unbuffered output),
  then the caller's KNOWN entries. Never the worker's own environment: no access key,
  database or broker URL, S3 credential or other setting of the control plane reaches it.
- Each name of a caller's `Environment` / `OptimizationEnvironment` / `OverrideEnvironment`
  is of one kind (`classify`):
  KNOWN: EagleNest's documented job and serving options, the LMI / TGI / SageMaker options
  of lengths, dtype and placement it reads, thread counts. Passed to the model server.
  DENIED: a name that can change how a Python, torch, transformers or vLLM process (or the
  C library under it) loads code, what it connects to, or a setting of the host or of
  EagleNest's control plane (`DENIED_NAMES`, `DENIED_PREFIXES`, names ending in `_PROXY`
  or holding `TRUST_REMOTE_CODE`, compared ignoring case). Refused at Create time
  (`check`, a ValidationException naming the variable) and again before a process starts
  (`EnvironmentRejected`), for rows stored before the rule existed.
  IGNORED: any other name (HF_TOKEN, HF_MODEL_ID, SAGEMAKER_PROGRAM...). Accepted and
  stored as sent (Describe echoes it, as AWS does), but it reaches no process; the worker
  logs it when a deployment or job starts and `eaglenest status` shows it
  (`ignored_warning`).
  A value holding a NUL character is refused whatever its name's kind.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum

#: optimization-job options (workers/jobs/options.py; README "Job options")
JOB_OPTIONS = frozenset({
    "EAGLENEST_HEAD", "EAGLENEST_MAX_STEPS", "EAGLENEST_BATCH_SIZE", "EAGLENEST_LEARNING_RATE",
    "EAGLENEST_SEED", "EAGLENEST_MAX_LENGTH", "EAGLENEST_DRAFT_VOCAB_SIZE",
    "EAGLENEST_NUM_LAYERS", "EAGLENEST_SEQ_PARTITIONS", "EAGLENEST_CHECKPOINT_EVERY",
    "EAGLENEST_DATASET",
    "EAGLENEST_REGENERATE", "EAGLENEST_REGENERATE_CACHE", "EAGLENEST_HOLDOUT",
    "EAGLENEST_BENCHMARK",
    "EAGLENEST_BENCH_CONCURRENCY", "EAGLENEST_BENCH_MAX_TOKENS", "EAGLENEST_BENCH_ROUNDS",
    "EAGLENEST_NUM_SPECULATIVE_TOKENS", "EAGLENEST_SERVING_BACKEND", "EAGLENEST_DEVICE",
    "EAGLENEST_TRAIN_PROCESSES", "EAGLENEST_BENCH_KS", "EAGLENEST_PROGRESS_EVERY",
    "EAGLENEST_CAPTURE_BACKEND", "EAGLENEST_CAPTURE_SHARD_SAMPLES", "EAGLENEST_KEEP_CAPTURE",
    "EAGLENEST_SHARD_CACHE",
    "EAGLENEST_EVAL_EVERY", "EAGLENEST_MAX_TRAIN_MINUTES", "EAGLENEST_PLATEAU_EVALS",
    "EAGLENEST_DTYPE", "EAGLENEST_DFLASH_BLOCK_SIZE", "EAGLENEST_DFLASH_LAYERS",
    "EAGLENEST_DFLASH_GAMMA", "EAGLENEST_BENCH_DECODINGS", "EAGLENEST_BENCH_MAX_ROUNDS",
    "EAGLENEST_BENCH_MINUTES", "EAGLENEST_TTT_STEPS", "EAGLENEST_REGENERATE_SAMPLES",
    "EAGLENEST_REGENERATE_TEMPERATURE",
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
#: placement and limits as SageMaker's LMI and TGI containers take them: GPUs per instance,
#: tensor-parallel degree, GPU memory share, prompt and total token limits (deploy.py)
PLACEMENT_OPTIONS = frozenset({
    "SM_NUM_GPUS", "TENSOR_PARALLEL_DEGREE", "OPTION_GPU_MEMORY_UTILIZATION",
    "MAX_INPUT_LENGTH", "MAX_TOTAL_TOKENS",
})
KNOWN = JOB_OPTIONS | SERVING_OPTIONS | PLACEMENT_OPTIONS

#: copied from the worker's environment when set (the operator's, not a caller's)
FROM_HOST = ("PATH", "HOME", "LANG", "LANGUAGE", "TMPDIR", "TZ", "USER", "LOGNAME",
             "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "LD_LIBRARY_PATH",
             "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
             "OMP_NUM_THREADS", "MKL_NUM_THREADS", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
             "EAGLENEST_TORCH_THREADS", "EAGLENEST_COMPUTE_REGISTRY")
FIXED = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
         "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1"}
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

#: DENIED name prefixes (compared in upper case): what the named programs read at start
DENIED_PREFIXES = (
    # the dynamic loader and C library: preloads, audit and iconv modules, malloc hooks,
    # tunables, the resolver
    "LD_", "GCONV_", "MALLOC_", "GLIBC_", "RES_", "LC_",
    # Python: module path, startup files, warning filters (they import modules), breakpoints
    "PYTHON",
    # torch, its compilers and collectives, GPU runtimes
    "TORCH", "PYTORCH_", "TRITON_", "CUDA_", "NVIDIA_", "NCCL_", "GLOO_", "OMPI_", "HIP_",
    "ROCR_", "HSA_",
    # Hugging Face: hub endpoint, offline switches, caches (remote-code modules included)
    "HF_HUB_", "HF_HOME", "HF_DATASETS_", "HF_ENDPOINT", "HF_MODULES_", "HUGGINGFACE_",
    "TRANSFORMERS_",
    # vLLM (plugins, custom ops, API key) and what it starts: Ray, tracing exporters
    "VLLM_", "RAY_", "OTEL_",
    # certificates and transports
    "SSL_", "REQUESTS_CA", "CURL_", "GRPC_",
    # cache and config directories of every library above (XDG_CACHE_HOME, XDG_CONFIG_HOME)
    "XDG_",
    # shells: startup files and exported functions
    "BASH_",
    # the control plane: AWS credentials and endpoints, the broker, the database
    "AWS_", "BOTO_", "CELERY_", "REDIS_", "PG", "GIT_", "EAGLENEST_",
)
#: DENIED names (compared in upper case); `FROM_HOST` and `FIXED` names not KNOWN are too
DENIED_NAMES = frozenset({
    # programs `webbrowser`, `pydoc` or a shell run
    "BROWSER", "DISPLAY", "WAYLAND_DISPLAY", "EDITOR", "VISUAL", "PAGER", "SHELL",
    # shell startup and expansion
    "ENV", "IFS", "PS1", "PS2", "PS4", "PROMPT_COMMAND", "CDPATH", "GLOBIGNORE", "SHELLOPTS",
    "BASHOPTS",
    # where programs, home, temporary files, locales and time zones are looked up
    "PATH", "HOME", "TMPDIR", "TMP", "TEMP", "LOCPATH", "NLSPATH", "TZDIR", "GETCONF_DIR",
    "HOSTALIASES", "LOCALDOMAIN", "RESOLV_HOST_CONF",
    # torch.distributed rendezvous (where ranks connect)
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "ROLE_RANK",
    # which frameworks transformers imports
    "USE_TORCH", "USE_TF", "USE_JAX", "USE_FLAX",
    # code a model container would run (LMI's entry point)
    "OPTION_ENTRYPOINT",
})
#: a DENIED name ends in this (http_proxy, HTTPS_PROXY, NO_PROXY, ALL_PROXY...)
DENIED_SUFFIX = "_PROXY"
#: a DENIED name holds this (OPTION_TRUST_REMOTE_CODE, HF_MODEL_TRUST_REMOTE_CODE...):
#: EagleNest never runs a model folder's code
DENIED_PART = "TRUST_REMOTE_CODE"
_HOST_SET = frozenset(name.upper() for name in (*FROM_HOST, *FIXED)) - KNOWN


class Kind(StrEnum):
    """What EagleNest does with a caller's variable (module docstring)."""

    KNOWN = "known"
    DENIED = "denied"
    IGNORED = "ignored"


class EnvironmentRejected(ValueError):
    """A caller's variable that may not reach a process; the message names it."""


def denial(name: str) -> str | None:
    """Why `name` is DENIED (the end of the refusal's message), or None when it is not."""
    if name in KNOWN:
        return None
    upper = name.upper()
    if upper.startswith("EAGLENEST_"):
        return ("EagleNest passes only its documented serving and job options; other "
                "EAGLENEST_* variables are settings of EagleNest itself")
    if upper in DENIED_NAMES or upper in _HOST_SET:
        return (f"{name} can change how a model server or training process loads code or "
                f"what it connects to, or is set by the operator")
    prefix = next((p for p in DENIED_PREFIXES if upper.startswith(p)), None)
    if prefix:
        return (f"variables named {prefix}* can change how a model server or training "
                f"process loads code or what it connects to")
    if upper.endswith(DENIED_SUFFIX):
        return f"variables named *{DENIED_SUFFIX} change what a process connects to"
    if DENIED_PART in upper:
        return "EagleNest never runs a model folder's own code"
    return None


def classify(name: str) -> Kind:
    """The kind of a caller's variable `name` (its value aside)."""
    if name in KNOWN:
        return Kind.KNOWN
    return Kind.DENIED if denial(name) else Kind.IGNORED


def rejection(name: str, value: str, where: str) -> str | None:
    """Why `name=value` may not be set in `where` (a member path), or None when it may."""
    reason = denial(name)
    if reason:
        return (f"Environment variable {name} in {where} is not allowed: {reason}; "
                f"see docs/security.md.")
    if "\x00" in value:
        return f"Environment variable {name} in {where} holds a NUL character."
    return None


def check(env: Mapping[str, str] | None, where: str) -> None:
    """Raise EnvironmentRejected for the first entry of `env` that is not allowed (a DENIED
    name, or a NUL in the value); KNOWN and IGNORED entries pass."""
    for name, value in sorted((env or {}).items()):
        reason = rejection(name, str(value), where)
        if reason:
            raise EnvironmentRejected(reason)


def passed(env: Mapping[str, str] | None) -> dict[str, str]:
    """The entries of `env` a process gets: the KNOWN ones."""
    return {k: v for k, v in (env or {}).items() if classify(k) is Kind.KNOWN}


def ignored(env: Mapping[str, str] | None) -> list[str]:
    """The IGNORED names of `env`, sorted: accepted and stored, passed to no process."""
    return sorted(k for k in (env or {}) if classify(k) is Kind.IGNORED)


def ignored_warning(env: Mapping[str, str] | None, member: str, of: str = "") -> str | None:
    """`ignores <member> variables A, B [of <of>]: ...` naming the IGNORED names of `env`
    (a worker log line or a status line puts its subject in front), or None without any."""
    names = ignored(env)
    if not names:
        return None
    owner = f" of {of}" if of else ""
    return (f"ignores {member} variables {', '.join(names)}{owner}: EagleNest does not pass "
            f"them to the model server or any process it starts (docs/security.md)")


def child_environment(user: Mapping[str, str] | None = None,
                      **fixed: str) -> dict[str, str]:
    """The environment of a child process: host basics, FIXED, `fixed`, then the caller's
    KNOWN entries (EnvironmentRejected for a DENIED one; IGNORED ones are left out)."""
    check(user, "Environment")
    env = {k: os.environ[k] for k in FROM_HOST if k in os.environ}
    env.update({k: v for k, v in os.environ.items() if k.startswith("LC_")})
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(FIXED)
    env.update(fixed)
    env.update(passed(user))
    return env
