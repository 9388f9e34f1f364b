"""Optimization-job knobs from `OptimizationEnvironment` (documented in README.md).

SageMaker passes job options as environment variables; EagleNest reads these (all
optional). A bad value fails the job at once with a reason naming the variable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HEADS = ("eagle", "eagle3", "peagle")
BACKENDS = ("vllm", "embedded")


class OptionError(ValueError):
    pass


@dataclass(frozen=True)
class JobOptions:
    head: str | None = None  # EAGLENEST_HEAD: eagle | eagle3 | peagle (default by architecture)
    max_steps: int = 200  # EAGLENEST_MAX_STEPS
    batch_size: int = 2  # EAGLENEST_BATCH_SIZE
    lr: float = 3e-4  # EAGLENEST_LEARNING_RATE
    seed: int = 0  # EAGLENEST_SEED
    max_length: int = 1024  # EAGLENEST_MAX_LENGTH (tokens per sample)
    draft_vocab_size: int = 8192  # EAGLENEST_DRAFT_VOCAB_SIZE (EAGLE-3 / P-EAGLE)
    num_layers: int = 1  # EAGLENEST_NUM_LAYERS: draft decoder layers (EAGLE-3 / P-EAGLE)
    checkpoint_every: int = 50  # EAGLENEST_CHECKPOINT_EVERY
    dataset: str | None = None  # EAGLENEST_DATASET: built-in name(s), comma-separated
    regenerate: bool = False  # EAGLENEST_REGENERATE: 1 = target rewrites assistant turns
    holdout: int = 8  # EAGLENEST_HOLDOUT: samples kept out of training for the benchmark
    benchmark: bool = True  # EAGLENEST_BENCHMARK: 0 skips the benchmark stage
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)  # EAGLENEST_BENCH_CONCURRENCY
    #: EAGLENEST_BENCH_KS: the K values the benchmark measures (and the schedule picks from);
    #: None: 1, 3, 5 up to num_speculative_tokens, plus num_speculative_tokens
    bench_ks: tuple[int, ...] | None = None
    bench_max_tokens: int = 64  # EAGLENEST_BENCH_MAX_TOKENS
    num_speculative_tokens: int = 5  # EAGLENEST_NUM_SPECULATIVE_TOKENS (K)
    backend: str | None = None  # EAGLENEST_SERVING_BACKEND: vllm | embedded
    device: str | None = None  # EAGLENEST_DEVICE: cpu | cuda (default: cuda if available)
    #: EAGLENEST_TRAIN_PROCESSES: data-parallel training processes (torchrun DDP, one per
    #: GPU); None: the worker's EAGLENEST_TRAIN_PROCESSES setting (default 1, in-process)
    train_processes: int | None = None

    def measured_ks(self) -> tuple[int, ...]:
        if self.bench_ks:
            return self.bench_ks
        k = self.num_speculative_tokens
        return tuple(sorted({x for x in (1, 3, 5) if x <= k} | {k}))


_INTS = {
    "EAGLENEST_MAX_STEPS": ("max_steps", 1, 10_000_000),
    "EAGLENEST_BATCH_SIZE": ("batch_size", 1, 4096),
    "EAGLENEST_SEED": ("seed", 0, 2**31 - 1),
    "EAGLENEST_MAX_LENGTH": ("max_length", 16, 1_000_000),
    "EAGLENEST_DRAFT_VOCAB_SIZE": ("draft_vocab_size", 16, 1_000_000),
    "EAGLENEST_NUM_LAYERS": ("num_layers", 1, 16),
    "EAGLENEST_CHECKPOINT_EVERY": ("checkpoint_every", 0, 10_000_000),
    "EAGLENEST_HOLDOUT": ("holdout", 1, 10_000),
    "EAGLENEST_BENCH_MAX_TOKENS": ("bench_max_tokens", 1, 100_000),
    "EAGLENEST_NUM_SPECULATIVE_TOKENS": ("num_speculative_tokens", 1, 64),
    "EAGLENEST_TRAIN_PROCESSES": ("train_processes", 1, 64),
}
_CHOICES = {
    "EAGLENEST_HEAD": ("head", HEADS),
    "EAGLENEST_SERVING_BACKEND": ("backend", BACKENDS),
    "EAGLENEST_DEVICE": ("device", ("cpu", "cuda")),
}
_LISTS = {  # comma-separated integers: (field, maximum, what they are)
    "EAGLENEST_BENCH_CONCURRENCY": ("concurrency", 1024, "concurrency levels, e.g. 1,2,4,8"),
    "EAGLENEST_BENCH_KS": ("bench_ks", 64, "K values, e.g. 1,3,5"),
}
_FLAGS = {"EAGLENEST_REGENERATE": "regenerate", "EAGLENEST_BENCHMARK": "benchmark"}


def _int(name: str, raw: str, lo: int, hi: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"{name}={raw!r} is not an integer") from None
    if not lo <= value <= hi:
        raise OptionError(f"{name}={value} must be between {lo} and {hi}")
    return value


def parse_options(env: dict[str, str] | None) -> JobOptions:
    env = env or {}
    kw: dict[str, Any] = {}
    for name, raw in env.items():
        if name in _INTS:
            field, lo, hi = _INTS[name]
            kw[field] = _int(name, raw, lo, hi)
        elif name in _CHOICES:
            field, allowed = _CHOICES[name]
            if raw not in allowed:
                raise OptionError(f"{name}={raw!r} must be one of {', '.join(allowed)}")
            kw[field] = raw
        elif name in _FLAGS:
            if raw not in ("0", "1", "true", "false"):
                raise OptionError(f"{name}={raw!r} must be 0 or 1")
            kw[_FLAGS[name]] = raw in ("1", "true")
        elif name == "EAGLENEST_LEARNING_RATE":
            try:
                kw["lr"] = float(raw)
            except ValueError:
                raise OptionError(f"{name}={raw!r} is not a number") from None
        elif name == "EAGLENEST_DATASET":
            kw["dataset"] = raw
        elif name in _LISTS:
            field, hi, what = _LISTS[name]
            values = [_int(name, p.strip(), 1, hi) for p in raw.split(",") if p.strip()]
            if not values:
                raise OptionError(f"{name} must list {what}")
            kw[field] = tuple(sorted(set(values))) if field == "bench_ks" else tuple(values)
    _check_together(kw)
    return JobOptions(**kw)


def _check_together(kw: dict[str, Any]) -> None:
    """Constraints between variables (each one alone is already valid)."""
    if kw.get("num_layers", 1) != 1 and kw.get("head") == "eagle":
        raise OptionError(f"EAGLENEST_NUM_LAYERS={kw['num_layers']} needs an EAGLE-3 or P-EAGLE "
                          "head; EAGLE-2 heads (EAGLENEST_HEAD=eagle) have one layer")
