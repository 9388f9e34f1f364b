"""Held-out draft accuracy, the plateau test and the stop decision for ``models.training.train``.

``HeldOut.accuracy(head)`` is training's step accuracy (greedy draft == target argmax, per
draft depth; models/heads/base.py ``scored_steps``) measured on samples the head never
trains on: the head in eval mode under ``torch.no_grad``, each depth's hits summed over
every held-out sample and divided by its scored positions (token-weighted, so the batching
does not change the figure). The captures come from ``source`` when given (the held-out
split of capture shards, models/training/shard_source.py: no target forward, the same tensors),
else the target runs once per held-out sample and they are kept in their own
``CaptureCache``, as training keeps its own. The global RNG (P-EAGLE's
drop-token draws) is forked and seeded, so an evaluation is deterministic and leaves
training's random stream exactly as it was (a run with evaluations trains the same head).

``plateaued(history, patience, margin)`` reads the held-out figures recorded in the history
rows, so a resumed run continues the count where the checkpoint left it.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch
from torch import nn

from eaglenest.models.capture.cache import CaptureCache, CaptureSource
from eaglenest.models.data.template import Sample
from eaglenest.models.heads.base import HeadBatch, HeadLoss
from eaglenest.models.target import Target
from eaglenest.models.training.config import TrainConfig

#: the history row key of a held-out evaluation (per depth; only on evaluated steps)
HELDOUT_KEY = "heldout_accuracy"
EVAL_SEED = 1234


def collate(samples: list[Sample], pad_id: int, device: str | torch.device) -> HeadBatch:
    """Right-pad to the longest sample."""
    width = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)  # [batch, seq]
    loss = torch.zeros((len(samples), width), dtype=torch.bool)  # [batch, seq]
    attn = torch.zeros((len(samples), width), dtype=torch.long)  # [batch, seq]
    for row, s in enumerate(samples):
        n = len(s.input_ids)
        ids[row, :n] = torch.tensor(s.input_ids)
        loss[row, :n] = torch.tensor(s.loss_mask, dtype=torch.bool)
        attn[row, :n] = 1
    return HeadBatch(ids.to(device), loss.to(device), attn.to(device))


class HeldOut:
    """Samples set aside from training, with their captures (computed on first use)."""

    def __init__(self, target: Target, samples: list[Sample], budget_bytes: int,
                 batch_size: int, autocast: contextlib.AbstractContextManager | None = None,
                 source: CaptureSource | None = None) -> None:
        """``source``: the captures of exactly ``samples``, in order (else ValueError);
        None: the target computes them."""
        if not samples:
            raise ValueError("no held-out samples")
        if source is not None and source.samples != samples:
            raise ValueError("the held-out capture source holds other samples")
        self.samples, self.batch_size = samples, max(1, batch_size)
        self.autocast = autocast or contextlib.nullcontext()
        self.cache: CaptureSource = source if source is not None else CaptureCache(
            target, samples, budget_bytes, autocast)
        tok = target.tokenizer
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else 0

    def accuracy(self, head: nn.Module, loss_kwargs: dict[str, Any],
                 device: torch.device) -> list[float]:
        """Per-depth accuracy over all held-out samples; the head's train/eval mode is
        restored afterwards."""
        was_training = head.training
        head.eval()
        hits: list[float] = []
        counts: list[int] = []
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=_rng_devices(device)):
                torch.manual_seed(EVAL_SEED)
                for lo in range(0, len(self.samples), self.batch_size):
                    result = self._batch(head, loss_kwargs, device, lo)
                    _accumulate(result, hits, counts)
        finally:
            head.train(was_training)
        return [h / max(c, 1) for h, c in zip(hits, counts, strict=True)]

    def _batch(self, head: nn.Module, loss_kwargs: dict[str, Any], device: torch.device,
               lo: int) -> HeadLoss:
        indices = list(range(lo, min(lo + self.batch_size, len(self.samples))))
        batch = collate([self.samples[i] for i in indices], self.pad, device)
        cap = self.cache.capture(indices, batch.input_ids.shape[1], device)
        with self.autocast:
            result: HeadLoss = head.loss(batch, cap, **loss_kwargs)  # type: ignore[operator]
        return result


def _rng_devices(device: torch.device) -> list[int]:
    return [device.index or 0] if device.type == "cuda" else []


def _accumulate(result: HeadLoss, hits: list[float], counts: list[int]) -> None:
    """Add a batch's per-depth hits (accuracy * scored positions) and counts."""
    for j, (acc, n) in enumerate(zip(result.step_accuracy, result.step_counts, strict=True)):
        if j == len(hits):
            hits.append(0.0)
            counts.append(0)
        hits[j] += acc * n
        counts[j] += n


def plateaued(history: list[dict[str, Any]], patience: int, margin: float) -> bool:
    """True when the last ``patience`` held-out evaluations each failed to raise acc@1 by
    at least ``margin`` over the best one before them. ``patience`` 0: never.

    Example (patience 2, margin 0.01): acc@1 0.30, 0.40, 0.405, 0.39 -> True (0.405 and
    0.39 do not beat 0.40 + 0.01); 0.30, 0.40, 0.405, 0.42 -> False.
    """
    if patience <= 0:
        return False
    firsts = [float(r[HELDOUT_KEY][0]) for r in history if r.get(HELDOUT_KEY)]
    if len(firsts) <= patience:
        return False
    best = max(firsts[:-patience])
    return all(a < best + margin for a in firsts[-patience:])


class Stopper:
    """Why training ends before the next step (a models.training.train STOP_REASONS value), or
    None. The clock starts at construction (``config.clock``, else time.perf_counter)."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.clock = config.clock or time.perf_counter
        self.start = self.clock()
        self.elapsed = 0.0  # seconds at the last reason() (the time budget's LR reads it)

    def reason(self, step: int, history: list[dict[str, Any]]) -> str | None:
        c = self.config
        if c.max_seconds is not None:  # one clock reading a step, for the stop and the LR
            self.elapsed = self.clock() - self.start
        if step >= c.max_steps:
            return "max steps"
        if c.stop_after and step >= c.stop_after:
            return "stop_after"
        if c.max_seconds is not None and self.elapsed > c.max_seconds:
            return "time budget"
        if plateaued(history, c.plateau_evals, c.plateau_margin):
            return "plateau"
        if c.should_stop is not None and c.should_stop():
            return "stopped"
        return None
