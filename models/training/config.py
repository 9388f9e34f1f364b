"""``TrainConfig``: the settings of one training run, in a module of its own.

Heads (models/heads/), checkpoints (models/checkpoint.py), the optimizer and the evaluation
(models/training/optim.py, evaluate.py) read it and ``train()`` (models/training/train.py)
runs it; none of them imports the trainer for it. ``config_record`` is its plain record
(provenance.json, the run file a torchrun launch reads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from eaglenest.models.heads.registry import DEFAULT_KIND

__all__ = ["TrainConfig", "config_record"]


@dataclass
class TrainConfig:
    head: str = DEFAULT_KIND  # a kind of models/heads/registry.py (HEADS)
    out_dir: str | None = None
    max_steps: int = 100
    batch_size: int = 2
    lr: float = 3e-4
    weight_decay: float = 0.01  # AdamW group
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    grad_clip: float = 0.5
    seed: int = 0
    ttt_steps: int = 3  # EAGLE-3 training-time-test steps
    #: P-EAGLE positions trained per anchor (the real one plus depth - 1 mask slots); 3
    #: trained better heads than 5 (docs/training.md); served K may be larger
    parallel_depth: int = 3
    #: P-EAGLE: a step's anchors in this many parts, a backward each (models/training/partition.py):
    #: the same gradients in the memory of one part, for long samples
    seq_partitions: int = 1
    keep_prob: float = 0.7  # P-EAGLE conditional drop-token keep probability
    step_decay: float = 1.0  # loss weight decay**j of draft step j (1.0: all steps equal)
    draft_vocab_size: int = 8192
    num_layers: int = 1  # EAGLE-3 / P-EAGLE draft decoder layers (EAGLE-1/2: always 1)
    # EAGLE-3 / P-EAGLE layer recipe (all three read by vLLM): hidden_norm before the
    # residual, an RMSNorm on the aux states before fc, TTT steps fed the post-norm hidden
    norm_before_residual: bool = True
    norm_before_fc: bool = True
    norm_output: bool = True
    optimizer: str = "muon"  # Muon for the layer's matrices + AdamW for the rest, or "adamw"
    muon_lr: float | None = None  # default: lr (Muon's update is scaled to AdamW's RMS)
    muon_weight_decay: float = 0.1
    muon_ns_dtype: str = "auto"  # Newton-Schulz matmuls: auto | float32 | bfloat16 (optim.py)
    mask_token_id: int | None = None  # P-EAGLE, DFlash; default: pad, else eos
    #: DFlash (models/heads/dflash.py): query slots of a block (the anchor + block - 1 mask
    #: slots; vLLM serves num_speculative_tokens = block - 1); public recipes use 16
    dflash_block_size: int = 8
    #: DFlash slot j's loss weight exp(-(j - 1) / gamma); the paper's values: 7 for block
    #: 16, 5 for block 10, 4 for block 8
    dflash_gamma: float = 4.0
    #: DFlash anchors (one block each) per sequence, at most its trained positions; 32 x 8
    #: query slots cost about one EAGLE-3 TTT step of a 256-token sequence
    dflash_anchors: int = 32
    #: DFlash variable-prefix objective: each block draws p in 1..block-1 real tokens
    dflash_variable_prefix: bool = False
    #: DFlash draft decoder layers, 1..8 (num_layers is EAGLE-3 / P-EAGLE's); public
    #: recipes use 5, fewer trains more steps in a CPU time budget
    dflash_layers: int = 3
    checkpoint_every: int = 0  # 0: only the final save
    stop_after: int | None = None  # stop early at this step (schedule still spans max_steps)
    max_seconds: float | None = None  # wall-clock budget; a resumable checkpoint is saved
    eval_every: int = 0  # steps between held-out evaluations (TrainData.heldout); 0: none
    #: stop when held-out acc@1 has not risen by plateau_margin over its best for this many
    #: consecutive evaluations; 0: never
    plateau_evals: int = 0
    plateau_margin: float = 0.005
    #: seconds for max_seconds (default time.perf_counter; tests inject a fake clock)
    clock: Callable[[], float] | None = field(default=None, repr=False, compare=False)
    #: polled before every step; True ends training early with a resumable checkpoint
    #: (the optimization job's stop / max-runtime check). Not part of provenance.
    should_stop: Callable[[], bool] | None = field(default=None, repr=False, compare=False)
    #: called with each checkpoint folder once written (the job mirrors it to the store)
    on_checkpoint: Callable[[Path], None] | None = field(default=None, repr=False, compare=False)
    #: called on the main process with each step's history row once the step is done
    on_step: Callable[[dict[str, Any]], None] | None = field(default=None, repr=False,
                                                             compare=False)
    resume: bool = False
    init_head: str | None = None
    checkpoint_format: str = "native"  # or "speculators" (EAGLE-3 / P-EAGLE)
    #: target hidden states kept (CPU RAM) so later epochs skip the target forward; 0: none
    capture_cache_mb: int = 4096
    speculative_tokens: int = 3  # written into speculators configs
    progress: bool = True


_HOOKS = ("should_stop", "on_checkpoint", "on_step", "clock")


def config_record(config: TrainConfig) -> dict[str, Any]:
    """The config's fields without its callbacks (provenance; a run file for other processes)."""
    return {f.name: getattr(config, f.name) for f in fields(config) if f.name not in _HOOKS}
