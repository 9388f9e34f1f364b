"""The worker's reading of a job's `OptimizationEnvironment`: foundation/job_options.py's
parser, which CreateOptimizationJob ran too, then what only the worker knows: the head kinds
of models/heads/registry.py (EAGLENEST_HEAD, and the options that depend on its kind).

A bad value raises ``OptionError`` naming the variable, which is the job's FailureReason as
it stands.
"""

from __future__ import annotations

from collections.abc import Mapping

from eaglenest.foundation.job_options import (
    BACKENDS,
    CAPTURE_BACKENDS,
    DEVICES,
    JobOptions,
    OptionError,
    parse_job_options,
)
from eaglenest.models.heads.registry import HEADS, KINDS

__all__ = ["BACKENDS", "CAPTURE_BACKENDS", "DEVICES", "JobOptions", "OptionError",
           "parse_options"]


def parse_options(env: Mapping[str, str] | None) -> JobOptions:
    """The job's options; the first bad variable raises OptionError with its message."""
    options = parse_job_options(env)
    check_head(options)
    return options


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
