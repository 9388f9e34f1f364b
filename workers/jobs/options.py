"""The worker's reading of a job's `OptimizationEnvironment`: foundation/job_options.py's
parser, which CreateOptimizationJob ran too, then what only the worker knows: the head kinds
of models/heads/registry.py (EAGLENEST_HEAD, and the options that depend on its kind).

A bad value raises ``OptionError`` naming the variable, which is the job's FailureReason as
it stands.

Block heads (HeadSpec.block, e.g. DFlash; their default decode mode is DecodeMode.BLOCK)
draft at most block_size - 1 tokens a round, so their K is the block length's: `check_kind`
refuses a K or a benchmarked K deeper than that, and `for_kind` gives the job's K for such a
head as min(BLOCK_K, block_size - 1) unless EAGLENEST_NUM_SPECULATIVE_TOKENS sets it; the
benchmark then measures K = 1, 3, 5, 7 capped by block_size - 1 (JobOptions.measured_ks).
Example: EAGLENEST_DFLASH_BLOCK_SIZE=5 -> K = 4, rows K = 1, 3, 4; 16 -> K = 7, rows 1, 3, 5, 7.

The benchmark's decodings (EAGLENEST_BENCH_DECODINGS, `bench_decodings`): each name must be a
models/decode/modes.py ``Decoding`` (checked by `parse_options`, which every job runs as its
worker starts it; the control plane cannot import models) that the head can run (``refusal``:
checked once the kind is known, `check_kind`). Unset, they follow the head's traits: on the
embedded backend the kind's default mode, then each of EXTRA_DECODINGS the head can run
(EAGLE-3: chain, tree, chain+adaptive; P-EAGLE: parallel, tree, parallel+adaptive, chain;
DFlash: block, block+adaptive); vLLM serves its one method, so only the default mode there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eaglenest.foundation.job_options import (
    BACKENDS,
    BLOCK_LAYERS,
    CAPTURE_BACKENDS,
    DEVICES,
    JobOptions,
    OptionError,
    parse_job_options,
)
from eaglenest.models.decode.modes import DecodeMode, Decoding, refusal
from eaglenest.models.heads.registry import HEADS, KINDS, HeadSpec
from eaglenest.models.training.config import TrainConfig
from eaglenest.workers.model_servers.process import VLLM

__all__ = ["BACKENDS", "CAPTURE_BACKENDS", "DEVICES", "JobOptions", "OptionError",
           "bench_decodings", "block_size", "check_kind", "decodings_for", "for_kind",
           "parse_options", "train_settings"]

#: the deepest K a block head's job drafts and measures unless told (rows K = 1, 3, 5, 7)
BLOCK_K = 7
#: JobOptions fields only block heads read (their variables are refused for other kinds)
BLOCK_FIELDS = ("dflash_block_size", "dflash_layers", "dflash_gamma")
DECODINGS_VARIABLE = "EAGLENEST_BENCH_DECODINGS"
#: the decodings an embedded benchmark measures besides the head's default mode, in this
#: order, where the head can run them (None: the default mode with adaptive depth)
EXTRA_DECODINGS: tuple[DecodeMode | None, ...] = (DecodeMode.TREE, None, DecodeMode.CHAIN)
#: the serving backend whose servers run one decoding, the head's own (its vLLM method)
ONE_METHOD_BACKEND = VLLM


def parse_options(env: Mapping[str, str] | None) -> JobOptions:
    """The job's options; the first bad variable raises OptionError with its message."""
    options = parse_job_options(env)
    for name in options.bench_decodings or ():
        _decoding(name)
    check_head(options)
    return options


def _decoding(name: str) -> Decoding:
    """Example: "tree+" -> OptionError "EAGLENEST_BENCH_DECODINGS: unknown decoding 'tree+';
    valid: chain, chain+adaptive, tree, ..." (Decoding.parse's list)."""
    try:
        return Decoding.parse(name)
    except ValueError as exc:
        raise OptionError(f"{DECODINGS_VARIABLE}: {exc}") from None


def check_head(options: JobOptions) -> None:
    """EAGLENEST_HEAD is a registry kind, and the options that need a kind's trait have it
    (each variable alone was already checked)."""
    head = options.head
    if head is None:
        return
    if head not in KINDS:
        raise OptionError(f"EAGLENEST_HEAD={head!r} must be one of {', '.join(KINDS)}")
    if options.num_layers != 1 and not HEADS[head].multi_layer:
        raise OptionError(f"EAGLENEST_NUM_LAYERS={options.num_layers} needs an EAGLE-3 or "
                          f"P-EAGLE head; EAGLE-2 heads (EAGLENEST_HEAD={head}) have one layer")
    if options.seq_partitions != 1 and not HEADS[head].partitions:
        raise OptionError(f"EAGLENEST_SEQ_PARTITIONS={options.seq_partitions} needs a P-EAGLE "
                          f"head (EAGLENEST_HEAD={head})")
    check_kind(options, head)


def _blocks(kind: str) -> bool:
    """A head of `kind` drafts a block per forward (HeadSpec.block)."""
    return HEADS[kind].block


def _variable(name: str) -> str:
    return str(JobOptions.model_fields[name].alias)


def block_size(options: JobOptions) -> int:
    """EAGLENEST_DFLASH_BLOCK_SIZE, else TrainConfig's default (block heads only)."""
    if options.dflash_block_size is not None:
        return options.dflash_block_size
    return int(TrainConfig.dflash_block_size)


def check_kind(options: JobOptions, kind: str) -> None:
    """The options that depend on a head of `kind` drafting blocks (module docstring):
    the block variables only for block heads; for those, K and the benchmarked K values at
    most block_size - 1, and a layer count in BLOCK_LAYERS. Also the benchmark's decodings
    (`bench_decodings`) on the job's backend, where it names one."""
    bench_decodings(options, kind, options.backend)
    if options.ttt_steps is not None and _steps_setting(kind) is None:
        kinds = ", ".join(k for k in HEADS if _steps_setting(k))
        raise OptionError(f"EAGLENEST_TTT_STEPS={options.ttt_steps} needs a head trained "
                          f"steps deep (EAGLENEST_HEAD={kinds}), not {kind}")
    if not _blocks(kind):
        for name in BLOCK_FIELDS:
            if getattr(options, name) is not None:
                kinds = ", ".join(k for k in HEADS if _blocks(k))
                raise OptionError(f"{_variable(name)}={getattr(options, name)} needs a block "
                                  f"head (EAGLENEST_HEAD={kinds}), not {kind}")
        return
    size, most = block_size(options), block_size(options) - 1
    where = f"a block of {size} slots drafts at most {most} (EAGLENEST_DFLASH_BLOCK_SIZE)"
    if "num_speculative_tokens" in options.model_fields_set and (
            options.num_speculative_tokens > most):
        raise OptionError(f"EAGLENEST_NUM_SPECULATIVE_TOKENS={options.num_speculative_tokens}: "
                          f"{where}")
    if options.bench_ks and max(options.bench_ks) > most:
        raise OptionError(f"EAGLENEST_BENCH_KS={max(options.bench_ks)}: {where}")
    layers = _layers(options)
    if layers is not None and not BLOCK_LAYERS[0] <= layers <= BLOCK_LAYERS[1]:
        raise OptionError(f"EAGLENEST_NUM_LAYERS={layers}: {HEADS[kind].title} heads have "
                          f"{BLOCK_LAYERS[0]} to {BLOCK_LAYERS[1]} layers")
    if options.dflash_layers is not None and "num_layers" in options.model_fields_set and (
            options.num_layers != options.dflash_layers):
        raise OptionError(f"EAGLENEST_DFLASH_LAYERS={options.dflash_layers} and "
                          f"EAGLENEST_NUM_LAYERS={options.num_layers} disagree; set one")


def _layers(options: JobOptions) -> int | None:
    """A block head's layer count: EAGLENEST_DFLASH_LAYERS, else EAGLENEST_NUM_LAYERS when
    set; None: TrainConfig's default."""
    if options.dflash_layers is not None:
        return options.dflash_layers
    return options.num_layers if "num_layers" in options.model_fields_set else None


def for_kind(options: JobOptions, kind: str) -> JobOptions:
    """The options as a head of `kind` reads them (checked by `check_kind`): a block head's
    K is min(BLOCK_K, block_size - 1) unless EAGLENEST_NUM_SPECULATIVE_TOKENS sets it
    (module docstring), so the job measures, trains and serves that K."""
    if not _blocks(kind) or "num_speculative_tokens" in options.model_fields_set:
        return options
    k = min(BLOCK_K, block_size(options) - 1)
    return options.model_copy(update={"num_speculative_tokens": k})


def _steps_setting(kind: str) -> str | None:
    """The TrainConfig field that sets how many draft steps a head of `kind` trains on its
    own outputs (its loss's "steps": EAGLE-3 ttt_steps, P-EAGLE parallel_depth); None for
    kinds without (EAGLE-1/2, block heads)."""
    return HEADS[kind].loss_settings.get("steps")


def train_settings(options: JobOptions, kind: str) -> dict[str, Any]:
    """The TrainConfig fields a head of `kind` takes from the options: EAGLENEST_TTT_STEPS
    as its steps setting (`_steps_setting`); a block head's block size, layers (`_layers`)
    and gamma. An unset one keeps TrainConfig's default."""
    settings: dict[str, Any] = {}
    if options.ttt_steps is not None and (steps := _steps_setting(kind)) is not None:
        settings[steps] = options.ttt_steps
    if not _blocks(kind):
        return settings
    settings["dflash_block_size"] = block_size(options)
    if (layers := _layers(options)) is not None:
        settings["dflash_layers"] = layers
    if options.dflash_gamma is not None:
        settings["dflash_gamma"] = options.dflash_gamma
    return settings


def bench_decodings(options: JobOptions, kind: str, backend: str | None) -> tuple[str, ...]:
    """The decoding names a head of ``kind`` is benchmarked in on ``backend`` (None: not
    known yet, the embedded backend's rules): `decodings_for` with EAGLENEST_BENCH_DECODINGS,
    its refusal an OptionError naming the variable."""
    try:
        return decodings_for(HEADS[kind], backend, options.bench_decodings)
    except ValueError as exc:
        where = f"={','.join(options.bench_decodings)}" if options.bench_decodings else ""
        raise OptionError(f"{DECODINGS_VARIABLE}{where}: {exc}") from None


def decodings_for(spec: HeadSpec, backend: str | None,
                  asked: tuple[str, ...] | None) -> tuple[str, ...]:
    """The decodings a head of ``spec`` is benchmarked in, the first measured at every K,
    the others at the largest (workers/jobs/bench_rows.py ``plan_rows``): ``asked`` when
    given, ValueError for a name Decoding.parse refuses, one the head cannot run, or on vLLM
    any but the head's own; None: by the head's traits (module docstring), e.g. EAGLE-3 on
    embedded -> ("chain", "tree", "chain+adaptive"), on vLLM -> ("chain",)."""
    own = Decoding(spec.default_mode)
    one_method = backend == ONE_METHOD_BACKEND
    if asked is None:
        return (own.name,) if one_method else _default_decodings(spec)
    for name in asked:
        decoding = Decoding.parse(name)
        why = refusal(decoding.mode, spec)
        if why is None and one_method and decoding != own:
            why = (f"the {backend} backend serves one decoding, the head's own "
                   f"({own.name}), not {name}")
        if why is not None:
            raise ValueError(why)
    return asked


def _default_decodings(spec: HeadSpec) -> tuple[str, ...]:
    """The head's default mode, then each of EXTRA_DECODINGS it can run."""
    names = [Decoding(spec.default_mode).name]
    for mode in EXTRA_DECODINGS:
        decoding = (Decoding(spec.default_mode, adaptive=True) if mode is None
                    else Decoding(mode))
        if refusal(decoding.mode, spec) is None and decoding.name not in names:
            names.append(decoding.name)
    return tuple(names)
