"""Optimization-job knobs from `OptimizationEnvironment` (documented in docs/configuration.md),
read by one parser for CreateOptimizationJob's check and the worker that runs the job.

SageMaker passes job options as environment variables; EagleNest reads these (all
optional). ``JobOptions`` is a pydantic model whose aliases are the variable names; each
field's parser takes the variable's string and raises ``OptionError`` naming the variable.
Unknown variables are ignored.

Contract:
- `parse_job_options(env)`: every variable's own check (ranges from foundation/host/ceilings.py
  JOB_RANGES and here, flags, lists, the dtype's spellings); the first bad one raises
  OptionError with its message, which is the job's FailureReason as it stands.
- `check_create(env, where, cpus, gpus, instance_type)`: CreateOptimizationJob's check:
  `parse_job_options`, then what Create knows of the host the job will run on:
  EAGLENEST_TRAIN_PROCESSES at most the GPUs of its DeploymentInstanceType,
  EAGLENEST_DEVICE=cuda only on a type with GPUs (the job's own: workers/jobs/placing.py),
  thread counts within the API host's CPUs (foundation/host/ceilings.py check_threads).
- What only the worker knows (the head kinds of models/heads/registry.py and the decoding
  names of models/decode/modes.py, which the control plane does not import) is checked by
  the worker's `parse_options` (workers/jobs/options.py) after this parser: here
  EAGLENEST_BENCH_DECODINGS is only a comma list of names, as EAGLENEST_HEAD is a string
  (a job asking for an unknown decoding fails as its worker starts it, naming the valid ones).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
)

from eaglenest.foundation.dtypes import DtypeError, normalize
from eaglenest.foundation.host.ceilings import (
    JOB_RANGES,
    THREAD_OPTIONS,
    LimitError,
    check_threads,
    check_train_processes,
    parse_int,
)

BACKENDS = ("vllm", "embedded")
DEVICES = ("cpu", "cuda")
#: EAGLENEST_CAPTURE_BACKEND (workers/jobs/capture_stage.py; docs/capture-shards.md)
CAPTURE_BACKENDS = ("auto", "hf", "vllm")
#: block heads (HeadSpec.block, e.g. DFlash): query slots per block (the anchor and its mask
#: slots; a round drafts at most block_size - 1 tokens), draft layers, and the loss decay
BLOCK_SIZES = (2, 16)
BLOCK_LAYERS = (1, 8)
MAX_GAMMA = 64.0
#: regeneration's sampled answers: per training example, and their temperature's ceiling
MAX_REGENERATE_SAMPLES = 4
MAX_TEMPERATURE = 2.0
#: training-time-test depth (EAGLENEST_TTT_STEPS): draft steps a head trains on its own
#: outputs; each adds a forward and backward over the sample
MAX_TTT_STEPS = 8


class OptionError(ValueError):
    pass


def _variable(info: ValidationInfo) -> str:
    field = JobOptions.model_fields[str(info.field_name)]
    return str(field.alias)


def _int(name: str, raw: str, lo: int, hi: int) -> int:
    """foundation/host/ceilings.py's parser: CreateOptimizationJob read the value the same way."""
    try:
        return parse_int(name, raw, lo, hi)
    except LimitError as exc:
        raise OptionError(str(exc)) from None


def _parser(parse: Callable[[str, str], Any]) -> BeforeValidator:
    """Parse a variable's string with ``parse(name, raw)``; other values (a field set by
    name, e.g. by ``model_copy``) pass as they are."""

    def run(value: Any, info: ValidationInfo) -> Any:
        return parse(_variable(info), value) if isinstance(value, str) else value

    return BeforeValidator(run)


def _between(lo: int, hi: int) -> BeforeValidator:
    return _parser(lambda name, raw: _int(name, raw, lo, hi))


def _limited(name: str) -> BeforeValidator:
    """The range foundation/host/ceilings.py gives `name` (checked at Create too)."""
    return _between(*JOB_RANGES[name])


def _one_of(allowed: tuple[str, ...]) -> BeforeValidator:
    def parse(name: str, raw: str) -> str:
        if raw not in allowed:
            raise OptionError(f"{name}={raw!r} must be one of {', '.join(allowed)}")
        return raw

    return _parser(parse)


def _flag(name: str, raw: str) -> bool:
    if raw not in ("0", "1", "true", "false"):
        raise OptionError(f"{name}={raw!r} must be 0 or 1")
    return raw in ("1", "true")


def _number(name: str, raw: str) -> float:
    """A finite float (``nan`` and ``inf`` are refused: no training step can use them)."""
    try:
        value = float(raw)
    except ValueError:
        raise OptionError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise OptionError(f"{name}={raw!r} is not a finite number")
    return value


def _minutes(name: str, raw: str) -> float:
    value = _number(name, raw)
    if not 0 <= value <= 525_600:  # a year
        raise OptionError(f"{name}={raw!r} must be minutes between 0 (no budget) and 525600")
    return value


def _temperature(name: str, raw: str) -> float:
    """A sampling temperature above 0 (0 is greedy: the answer regeneration always writes)
    and at most MAX_TEMPERATURE."""
    value = _number(name, raw)
    if not 0 < value <= MAX_TEMPERATURE:
        raise OptionError(f"{name}={raw!r} must be a number above 0 and at most "
                          f"{MAX_TEMPERATURE:g}")
    return value


def _gamma(name: str, raw: str) -> float:
    """DFlash's loss decay: w_j = exp(-(j - 1) / gamma), so any finite gamma > 0 is a
    weighting; at 64 the last slot of a 16-slot block still weighs exp(-14 / 64) = 0.80 of
    the first (larger is all but uniform)."""
    value = _number(name, raw)
    if not 0 < value <= MAX_GAMMA:
        raise OptionError(f"{name}={raw!r} must be a number above 0 and at most {MAX_GAMMA:g}")
    return value


def _dtype(name: str, raw: str) -> str:
    """foundation/dtypes.py's spellings (fp16, bf16, float32, auto, ...) -> its value."""
    try:
        return normalize(raw, name)
    except DtypeError as exc:
        raise OptionError(str(exc)) from None


def _levels(name: str, raw: str) -> tuple[int, ...]:
    levels = [_int(name, p.strip(), 1, 1024) for p in raw.split(",") if p.strip()]
    if not levels:
        raise OptionError(f"{name} must list concurrency levels, e.g. 1,2,4,8")
    return tuple(levels)


def _names(name: str, raw: str) -> tuple[str, ...]:
    """A comma list of names, blanks dropped, each once in its first place: "tree, chain,tree"
    -> ("tree", "chain"). The names are the worker's to check (module contract)."""
    names = tuple(dict.fromkeys(p.strip() for p in raw.split(",") if p.strip()))
    if not names:
        raise OptionError(f"{name} must list decodings, e.g. chain,tree")
    return names


def _ks(name: str, raw: str) -> tuple[int, ...]:
    ks = {_int(name, p.strip(), 1, 64) for p in raw.split(",") if p.strip()}
    if not ks:
        raise OptionError(f"{name} must list K values, e.g. 1,3,5")
    return tuple(sorted(ks))


class JobOptions(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    #: a registry kind (models/heads/registry.py: the worker checks it, `parse_options`);
    #: None: the architecture's default
    head: Annotated[str | None, Field(alias="EAGLENEST_HEAD")] = None
    max_steps: Annotated[int, _limited("EAGLENEST_MAX_STEPS"),
                         Field(alias="EAGLENEST_MAX_STEPS")] = 100_000
    batch_size: Annotated[int, _limited("EAGLENEST_BATCH_SIZE"),
                          Field(alias="EAGLENEST_BATCH_SIZE")] = 2
    lr: Annotated[float, _parser(_number), Field(alias="EAGLENEST_LEARNING_RATE")] = 3e-4
    seed: Annotated[int, _between(0, 2**31 - 1), Field(alias="EAGLENEST_SEED")] = 0
    #: tokens per sample
    max_length: Annotated[int, _limited("EAGLENEST_MAX_LENGTH"),
                          Field(alias="EAGLENEST_MAX_LENGTH")] = 1024
    #: EAGLE-3 / P-EAGLE draft vocabulary
    draft_vocab_size: Annotated[int, _between(16, 1_000_000),
                                Field(alias="EAGLENEST_DRAFT_VOCAB_SIZE")] = 8192
    #: draft decoder layers (kinds with HeadSpec.multi_layer)
    num_layers: Annotated[int, _between(1, 16), Field(alias="EAGLENEST_NUM_LAYERS")] = 1
    #: block heads (HeadSpec.block): query slots per block, 2..16: the anchor and
    #: block_size - 1 mask slots, so a round drafts at most block_size - 1 tokens (the K
    #: values the job measures are capped there: workers/jobs/options.py ``for_kind``);
    #: None: TrainConfig's default
    dflash_block_size: Annotated[int | None, _between(*BLOCK_SIZES),
                                 Field(alias="EAGLENEST_DFLASH_BLOCK_SIZE")] = None
    #: block heads: draft decoder layers, 1..8 (TrainConfig.dflash_layers); None:
    #: EAGLENEST_NUM_LAYERS when set, else TrainConfig's default
    dflash_layers: Annotated[int | None, _between(*BLOCK_LAYERS),
                             Field(alias="EAGLENEST_DFLASH_LAYERS")] = None
    #: block heads: the loss decay gamma of block slot j's weight exp(-(j - 1) / gamma),
    #: in (0, 64]; None: TrainConfig's default
    dflash_gamma: Annotated[float | None, _parser(_gamma),
                            Field(alias="EAGLENEST_DFLASH_GAMMA")] = None
    #: training-time-test depth: EAGLE-3's TTT steps, P-EAGLE's trained positions (the
    #: setting a kind's HeadSpec.loss_settings names "steps"); None: TrainConfig's default
    ttt_steps: Annotated[int | None, _between(1, MAX_TTT_STEPS),
                         Field(alias="EAGLENEST_TTT_STEPS")] = None
    #: a step's anchors in this many parts, a backward each (kinds with HeadSpec.partitions:
    #: models/training/partition.py): the same training in the memory of one part, for long samples
    seq_partitions: Annotated[int, _between(1, 64),
                              Field(alias="EAGLENEST_SEQ_PARTITIONS")] = 1
    checkpoint_every: Annotated[int, _between(0, 10_000_000),
                                Field(alias="EAGLENEST_CHECKPOINT_EVERY")] = 50
    #: steps between progress lines (log, status, training_log.jsonl published to the output
    #: prefix)
    progress_every: Annotated[int, _between(1, 10_000_000),
                              Field(alias="EAGLENEST_PROGRESS_EVERY")] = 10
    #: steps between held-out accuracy evaluations on the EAGLENEST_HOLDOUT samples (and
    #: one at the last step); 0: none (docs/configuration.md: why 50)
    eval_every: Annotated[int, _between(0, 10_000_000),
                          Field(alias="EAGLENEST_EVAL_EVERY")] = 50
    #: wall-clock training budget in minutes (a resumable checkpoint is kept); 0: none.
    #: With the plateau below it ends training by default; EAGLENEST_MAX_STEPS is a cap
    max_train_minutes: Annotated[float, _parser(_minutes),
                                 Field(alias="EAGLENEST_MAX_TRAIN_MINUTES")] = 30.0
    #: stop after this many evaluations without held-out acc@1 improving; 0: never
    plateau_evals: Annotated[int, _between(0, 1000), Field(alias="EAGLENEST_PLATEAU_EVALS")] = 4
    #: built-in dataset name(s), comma-separated
    dataset: Annotated[str | None, Field(alias="EAGLENEST_DATASET")] = None
    #: 1 (default) = the target rewrites the assistant turns (training and held-out) first
    regenerate: Annotated[bool, _parser(_flag), Field(alias="EAGLENEST_REGENERATE")] = True
    #: sampled answers per training example regenerated besides the greedy one (each a
    #: training example of its own; the held-out ones stay greedy); 0: none
    regenerate_samples: Annotated[int, _between(0, MAX_REGENERATE_SAMPLES),
                                  Field(alias="EAGLENEST_REGENERATE_SAMPLES")] = 0
    #: the sampled answers' temperature
    regenerate_temperature: Annotated[float, _parser(_temperature),
                                      Field(alias="EAGLENEST_REGENERATE_TEMPERATURE")] = 0.8
    #: 1 (default) = regenerated examples are reused from, and written to, the cache under
    #: the S3OutputLocation (workers/jobs/regen_cache.py); 0: neither read nor written
    regenerate_cache: Annotated[bool, _parser(_flag),
                                Field(alias="EAGLENEST_REGENERATE_CACHE")] = True
    #: samples kept out of training for the benchmark
    holdout: Annotated[int, _between(1, 10_000), Field(alias="EAGLENEST_HOLDOUT")] = 8
    #: 0 skips the benchmark stage
    benchmark: Annotated[bool, _parser(_flag), Field(alias="EAGLENEST_BENCHMARK")] = True
    concurrency: Annotated[tuple[int, ...], _parser(_levels),
                           Field(alias="EAGLENEST_BENCH_CONCURRENCY")] = (1, 2, 4, 8, 16)
    #: the K values the benchmark measures (and the schedule picks from); None: 1, 3, 5 up to
    #: num_speculative_tokens, plus num_speculative_tokens
    bench_ks: Annotated[tuple[int, ...] | None, _parser(_ks),
                        Field(alias="EAGLENEST_BENCH_KS")] = None
    bench_max_tokens: Annotated[int, _between(1, 100_000),
                                Field(alias="EAGLENEST_BENCH_MAX_TOKENS")] = 64
    #: rounds each row is measured at each level at least; a row is scheduled only if it
    #: wins in every one
    bench_rounds: Annotated[int, _between(1, 10), Field(alias="EAGLENEST_BENCH_ROUNDS")] = 2
    #: the most rounds at a level: more than bench_rounds while the leading, baseline or
    #: fastest row's pooled spread is 5% or more (workers/jobs/bench_rows.py); at least
    #: bench_rounds
    bench_max_rounds: Annotated[int, _between(1, 20),
                                Field(alias="EAGLENEST_BENCH_MAX_ROUNDS")] = 6
    #: the benchmark stage's budget in minutes: no round beyond bench_rounds starts unless it
    #: fits (the bench_rounds rounds always run); 0: none
    bench_minutes: Annotated[float, _parser(_minutes),
                             Field(alias="EAGLENEST_BENCH_MINUTES")] = 10.0
    #: decoding names (models/decode/modes.py Decoding: chain, tree, parallel, block, each
    #: optionally +adaptive): the first measured at every K, the others at the largest; None:
    #: by head kind and backend (workers/jobs/options.py ``bench_decodings``)
    bench_decodings: Annotated[tuple[str, ...] | None, _parser(_names),
                               Field(alias="EAGLENEST_BENCH_DECODINGS")] = None
    #: K
    num_speculative_tokens: Annotated[int, _between(1, 64),
                                      Field(alias="EAGLENEST_NUM_SPECULATIVE_TOKENS")] = 5
    backend: Annotated[str | None, _one_of(BACKENDS),
                       Field(alias="EAGLENEST_SERVING_BACKEND")] = None
    #: None: cuda if available
    device: Annotated[str | None, _one_of(DEVICES), Field(alias="EAGLENEST_DEVICE")] = None
    #: the dtype the target runs in on GPUs (float16, bfloat16, float32 or auto; the head is
    #: exported in it); None: auto, the checkpoint's own, float16 where bfloat16 cannot run
    #: (workers/jobs/job_target.py ``job_dtype``). The CPU: float32 always
    dtype: Annotated[str | None, _parser(_dtype), Field(alias="EAGLENEST_DTYPE")] = None
    #: data-parallel training processes (torchrun DDP, one per GPU); None: the worker's
    #: EAGLENEST_TRAIN_PROCESSES setting (default 1, in-process)
    train_processes: Annotated[int | None, _limited("EAGLENEST_TRAIN_PROCESSES"),
                               Field(alias="EAGLENEST_TRAIN_PROCESSES")] = None
    #: where training's hidden states come from: in the training process, or shards a
    #: capture stage writes first with transformers (hf) or vLLM (vllm); auto chooses by
    #: the target's size (workers/jobs/capture_stage.py ``choose_backend``)
    capture_backend: Annotated[str, _one_of(CAPTURE_BACKENDS),
                               Field(alias="EAGLENEST_CAPTURE_BACKEND")] = "auto"
    #: samples per capture shard (hf, vllm)
    capture_shard_samples: Annotated[int, _between(1, 4096),
                                     Field(alias="EAGLENEST_CAPTURE_SHARD_SAMPLES")] = 64
    #: 1 = the capture shards are published with the outputs (`capture/`), not deleted
    keep_capture: Annotated[bool, _parser(_flag), Field(alias="EAGLENEST_KEEP_CAPTURE")] = False
    #: 1 (default) = capture shards (hf, vllm) are reused from, and written to, the cache
    #: under the S3OutputLocation (workers/jobs/shard_cache.py); 0: neither read nor written
    shard_cache: Annotated[bool, _parser(_flag), Field(alias="EAGLENEST_SHARD_CACHE")] = True

    def measured_ks(self) -> tuple[int, ...]:
        if self.bench_ks:
            return self.bench_ks
        k = self.num_speculative_tokens
        return tuple(sorted({x for x in (1, 3, 5) if x <= k} | {k}))


def parse_job_options(env: Mapping[str, str] | None) -> JobOptions:
    """The job's options; the first bad variable raises OptionError with its message."""
    try:
        options = JobOptions.model_validate(dict(env or {}))
    except ValidationError as exc:
        cause = exc.errors()[0].get("ctx", {}).get("error")
        if isinstance(cause, OptionError):
            raise cause from None
        raise OptionError(str(exc)) from None
    if options.bench_max_rounds < options.bench_rounds and (
            "bench_max_rounds" in options.model_fields_set):
        raise OptionError(f"EAGLENEST_BENCH_MAX_ROUNDS={options.bench_max_rounds} is below "
                          f"EAGLENEST_BENCH_ROUNDS={options.bench_rounds}")
    if options.regenerate_samples and not options.regenerate:
        raise OptionError(f"EAGLENEST_REGENERATE_SAMPLES={options.regenerate_samples} needs "
                          "EAGLENEST_REGENERATE=1 (the target answers the examples)")
    return options


def check_create(env: Mapping[str, str] | None, where: str, cpus: int, gpus: int,
                 instance_type: str) -> JobOptions:
    """CreateOptimizationJob (module contract): OptionError
    "<where>: <the worker's message> (EagleNest's limits: docs/configuration.md)."."""
    env = env or {}
    try:
        options = parse_job_options(env)
        if options.train_processes is not None:
            check_train_processes(options.train_processes, gpus, instance_type)
        if options.device == "cuda" and not gpus:
            raise OptionError(f"EAGLENEST_DEVICE=cuda needs a GPU instance type: "
                              f"{instance_type} has none (a job runs on its own GPUs only)")
        for name in THREAD_OPTIONS:
            if name in env:
                check_threads(name, str(env[name]), cpus)
    except (OptionError, LimitError) as exc:
        raise OptionError(f"{where}: {exc} (EagleNest's limits: docs/configuration.md).") \
            from None
    return options
