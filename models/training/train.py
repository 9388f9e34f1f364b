"""Train a draft head against a frozen target: ``train(config, data, device) -> TrainResult``.

AdamW with linear warmup then cosine decay, gradient clipping, fp32 on CPU and bf16
autocast on CUDA, checkpoints every N steps that resume exactly (head weights, optimizer,
scheduler, data position and RNG), optional start from an existing head, tqdm progress
with the loss and the per-step greedy draft accuracy. Same seed, same data -> same head.
Held-out accuracy (models/training/evaluate.py) every ``eval_every`` steps and at the last, in that
step's row (``heldout_accuracy``). Training ends at ``max_steps`` or earlier (``stop_after``,
``max_seconds``, a held-out plateau, ``should_stop``: ``TrainResult.stop_reason``); the LR
schedule spans ``max_steps``, or ``max_seconds`` of wall clock where that ends first, so
only a plateau or a stop ends it part-way (LR above its floor).
Every step appends a row to the history (step, loss, lr, accuracy, tokens over all ranks,
`ts`: ISO-8601 UTC) and hands it to ``TrainConfig.on_step`` on the main process.
Under torchrun the same call trains data-parallel (DDP) on every process: see
``models/training/distributed.py`` (and ``models/training/batches.py`` for each rank's samples).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from eaglenest.models.capture.cache import CaptureCache, CaptureSource
from eaglenest.models.checkpoint import head_kind, load_start_head, save_head
from eaglenest.models.data.template import Sample
from eaglenest.models.heads.registry import HEADS
from eaglenest.models.target import Target
from eaglenest.models.training import distributed, partition
from eaglenest.models.training.batches import BatchStream, RankStream, batch_stream
from eaglenest.models.training.config import TrainConfig, config_record
from eaglenest.models.training.evaluate import HELDOUT_KEY, HeldOut, Stopper, collate
from eaglenest.models.training.optim import BudgetShare, make_optimizer

STATE_FILE = "trainer_state.pt"
#: TrainResult.stop_reason values
STOP_REASONS = ("max steps", "stop_after", "time budget", "plateau", "stopped")


@dataclass
class TrainData:
    target: Target
    samples: list[Sample]
    source: str = ""  # recorded in provenance.json
    #: captures shared across runs on the same samples (e.g. several heads), or read from
    #: capture shards (models/capture/shards.py); None: own in-process cache
    cache: CaptureSource | None = field(default=None, repr=False, compare=False)
    #: samples never trained on, encoded like ``samples``: the held-out accuracy's
    heldout: list[Sample] = field(default_factory=list, repr=False, compare=False)
    #: their captures read from shards (samples ``heldout``); None: the target runs them
    heldout_cache: CaptureSource | None = field(default=None, repr=False, compare=False)


@dataclass
class TrainResult:
    head: nn.Module
    steps: int
    loss: float
    step_accuracy: list[float]  # mean over the last steps, one per draft step / depth
    tokens_per_second: float
    seconds: float
    history: list[dict[str, Any]] = field(default_factory=list)
    out_dir: Path | None = None
    #: why training ended: one of STOP_REASONS
    stop_reason: str = "max steps"
    #: the last held-out evaluation, one per depth ([] when none ran), and its step
    heldout_accuracy: list[float] = field(default_factory=list)
    heldout_step: int | None = None
    eval_seconds: float = 0.0  # of ``seconds``, spent on held-out evaluations


# ---- head construction: models/heads/registry.py (``HEADS[kind].build(target, samples,
# config)``, ``.loss_kwargs``) ------------------------------------------------------------


# ---- optimisation ------------------------------------------------------------------------
def _autocast(device: torch.device) -> contextlib.AbstractContextManager:
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ---- checkpoints -------------------------------------------------------------------------
def _save_state(
    out: Path,
    step: int,
    head: nn.Module,
    opt: Any,
    sched: Any,
    stream: BatchStream | RankStream,
    history: list[dict[str, Any]],
    data: TrainData,
    config: TrainConfig,
    place: distributed.Dist = distributed.Dist(),
) -> Path:
    ckpt = out / "checkpoints" / f"step-{step:08d}"
    rng = distributed.gather(_rng_state(), place)  # a collective: every rank gets here
    if not place.is_main:
        return ckpt
    _save_head(head, ckpt, data, config, step, history)
    state = {
        "step": step,
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "stream": stream.state(),
        "history": history,
        **rng[0],
    }
    if place.enabled:
        state["rank_rng"] = rng
    torch.save(state, ckpt / STATE_FILE)
    (out / "checkpoints" / "latest").write_text(ckpt.name)
    if config.on_checkpoint is not None:
        config.on_checkpoint(ckpt)
    return ckpt


def _rng_state() -> dict[str, Any]:
    return {
        "rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _load_rng(state: dict[str, Any], place: distributed.Dist) -> None:
    ranks = state.get("rank_rng") or []
    mine = ranks[place.rank] if len(ranks) == place.world_size else state
    torch.set_rng_state(mine["rng"])
    if mine["cuda_rng"]:
        torch.cuda.set_rng_state_all(mine["cuda_rng"])


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    pointer = Path(out_dir) / "checkpoints" / "latest"
    return pointer.parent / pointer.read_text().strip() if pointer.is_file() else None


def _save_head(
    head: nn.Module,
    out: Path,
    data: TrainData,
    config: TrainConfig,
    step: int,
    history: list[dict[str, Any]],
) -> None:
    provenance = {
        "data": data.source,
        "samples": len(data.samples),
        "steps": step,
        "seed": config.seed,
        "head": head_kind(head),
        "target": str(data.target.folder or ""),
        "train_config": config_record(config),
        "metrics": history[-1] if history else {},
    }
    save_head(
        head,
        out,
        verifier=str(data.target.folder or ""),
        fmt=config.checkpoint_format,
        speculative_tokens=config.speculative_tokens,
        provenance=provenance,
    )


# ---- the loop ------------------------------------------------------------------------------
def train(config: TrainConfig, data: TrainData, device: str | torch.device = "cpu") -> TrainResult:
    if config.head not in HEADS:
        raise ValueError(f"unknown head {config.head!r}; one of {sorted(HEADS)}")
    if config.num_layers < 1 or (not HEADS[config.head].multi_layer and config.num_layers != 1):
        raise ValueError(f"num_layers={config.num_layers}: EAGLE-3 and P-EAGLE heads take 1 or "
                         "more draft layers, EAGLE-1/2 heads exactly 1")
    if config.seq_partitions < 1 or (config.seq_partitions > 1
                                     and not HEADS[config.head].partitions):
        parted = [kind for kind, spec in HEADS.items() if spec.partitions]
        raise ValueError(f"seq_partitions={config.seq_partitions}: 1, or more for {parted} "
                         "heads")
    place, device = distributed.setup(device)
    out = Path(config.out_dir) if config.out_dir else None
    torch.manual_seed(config.seed)
    ckpt = latest_checkpoint(out) if (out and config.resume) else None
    if ckpt is not None:
        head = load_start_head(ckpt, data.target, config)
    elif config.init_head:
        head = load_start_head(config.init_head, data.target, config)
    else:
        head = HEADS[config.head].build(data.target, data.samples, config)
    head.to(device).train()
    budget = BudgetShare() if config.max_seconds else None
    opt, sched = make_optimizer(head, config, budget)
    stream = batch_stream(data.samples, data.cache, config.batch_size, config.seed, place)
    step, history = 0, []
    if ckpt is not None:
        state = torch.load(ckpt / STATE_FILE, map_location="cpu", weights_only=True)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        stream.load_state(state["stream"])
        step, history = int(state["step"]), list(state["history"])
        _load_rng(state, place)
    return _run(head, opt, sched, stream, step, history, data, config, device, out, place,
                budget)


def _step_row(step: int, result: Any, step_tokens: int, lr: float, place: distributed.Dist,
              device: torch.device) -> dict[str, Any]:
    """One history row: loss and accuracy are means over ranks, tokens their sum (one
    all-reduce; unchanged in one process), `ts` the step's end in ISO-8601 UTC."""
    loss, *accuracy, mean_tokens = distributed.mean(
        [float(result.loss.detach()), *result.step_accuracy, float(step_tokens)], place, device)
    ts = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {"step": step, "loss": loss, "lr": lr, "accuracy": accuracy,
            "tokens": round(mean_tokens * place.world_size), "ts": ts}


def _run(
    head: nn.Module,
    opt: Any,
    sched: Any,
    stream: BatchStream | RankStream,
    step: int,
    history: list[dict[str, Any]],
    data: TrainData,
    config: TrainConfig,
    device: torch.device,
    out: Path | None,
    place: distributed.Dist = distributed.Dist(),
    budget: BudgetShare | None = None,
) -> TrainResult:
    tok = data.target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    kwargs = HEADS[config.head].loss_kwargs(config)
    loss_fn = distributed.loss_fn(head, kwargs, place, device, config.head)  # DDP when >1 rank
    params = [p for p in head.parameters() if p.requires_grad]
    cache = data.cache
    if cache is None or cache.samples is not data.samples:
        cache = CaptureCache(data.target, data.samples, config.capture_cache_mb << 20,
                             _autocast(device))
    heldout = HeldOut(data.target, data.heldout, config.capture_cache_mb << 20,
                      config.batch_size, _autocast(device), data.heldout_cache
                      ) if data.heldout else None
    tokens, start, stopper, eval_seconds = 0, time.perf_counter(), Stopper(config), 0.0
    show = config.progress and place.is_main
    bar = tqdm(total=config.max_steps, initial=step, disable=not show, desc="train")
    end = min(config.max_steps, config.stop_after or config.max_steps)
    while True:
        reason = stopper.reason(step, history)
        if distributed.agree(reason is not None, place, device):  # all ranks stop together
            break
        if budget is not None and config.max_seconds:  # one LR on every rank
            used = stopper.elapsed / config.max_seconds  # the clock the stop reads
            budget.used = distributed.mean([used], place, device)[0]
        indices = distributed.shard(stream.next_indices(), place)  # this rank's share
        batch = collate([data.samples[i] for i in indices], pad, device)
        cap = cache.capture(indices, batch.input_ids.shape[1], device)
        result = _optimise(loss_fn, batch, cap, opt, sched, params, config, device)
        step += 1
        step_tokens = int(batch.attention_mask.sum())
        tokens += step_tokens
        row = _step_row(step, result, step_tokens, sched.get_last_lr()[0], place, device)
        if heldout and config.eval_every and (step % config.eval_every == 0 or step == end):
            clock = time.perf_counter()
            row[HELDOUT_KEY] = heldout.accuracy(head, kwargs, device)
            eval_seconds += time.perf_counter() - clock
        history.append(row)
        if config.on_step is not None and place.is_main:
            config.on_step(dict(row))
        bar.update(1)
        bar.set_postfix(loss=f"{row['loss']:.3f}",
                        acc="/".join(f"{a:.2f}" for a in row["accuracy"]))
        if out and config.checkpoint_every and step % config.checkpoint_every == 0:
            _save_state(out, step, head, opt, sched, stream, history, data, config, place)
    bar.close()
    tokens = distributed.total(tokens, place, device)
    seconds = time.perf_counter() - start
    if out and step < config.max_steps and config.checkpoint_every:
        _save_state(out, step, head, opt, sched, stream, history, data, config, place)
    if out and place.is_main:
        _save_head(head, out, data, config, step, history)
    distributed.barrier(place)  # the output is complete when train() returns on any rank
    return _result(head, step, history, tokens, seconds, out, reason or "stopped",
                   eval_seconds)


def _optimise(loss_fn: distributed.LossFn, batch: Any, cap: Any, opt: Any, sched: Any,
              params: list[nn.Parameter], config: TrainConfig, device: torch.device) -> Any:
    """One optimiser and scheduler step on ``batch`` (in ``config.seq_partitions`` parts);
    its HeadLoss."""
    opt.zero_grad(set_to_none=True)
    result = partition.backward(loss_fn, batch, cap, config.seq_partitions,
                                lambda: _autocast(device), HEADS[config.head].partitions)
    torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
    opt.step()
    sched.step()
    return result


def _result(head: nn.Module, step: int, history: list[dict[str, Any]], tokens: int,
            seconds: float, out: Path | None, reason: str, eval_seconds: float
            ) -> TrainResult:
    """Training accuracy: the mean over the last 10 steps; held-out: the last evaluation."""
    recent = history[-10:]
    depth = len(recent[-1]["accuracy"]) if recent else 0
    acc = [sum(h["accuracy"][j] for h in recent) / len(recent) for j in range(depth)]
    evaluated = [h for h in history if h.get(HELDOUT_KEY)]
    last = evaluated[-1] if evaluated else {}
    return TrainResult(head=head, steps=step, loss=recent[-1]["loss"] if recent else float("nan"),
                       step_accuracy=acc, tokens_per_second=tokens / max(seconds, 1e-9),
                       seconds=seconds, history=history, out_dir=out, stop_reason=reason,
                       heldout_accuracy=list(last.get(HELDOUT_KEY, [])),
                       heldout_step=last.get("step"), eval_seconds=eval_seconds)
