"""Target hidden states computed once per training sample and reused every epoch.

The target is frozen, so its hidden states for a sample never change. Running it again on
every step (what a naive trainer does) costs as much as the head itself on a CPU; this
cache runs it once per sample, lazily (the first epoch pays, the next ones do not), and
keeps ``aux`` [seq, n_aux * hidden], ``last_hidden`` [seq, hidden] and the target's argmax
[seq] on the CPU. The logits are recomputed from ``last_hidden`` with the target's lm_head
when a loss needs them (only the draft-vocabulary columns for EAGLE-3 / P-EAGLE).

Every sample is captured alone (batch 1, no padding), whether or not it is cached, so a
cache hit and a miss give the same tensors: training is the same with any budget, and a
resumed run (which starts with an empty cache) continues exactly.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from eaglenest.models.data.template import Sample
from eaglenest.models.target import Capture, Target


class CaptureSource(Protocol):
    """Where training gets its captures: this in-process cache, or capture shards on disk
    (models/capture/shards.py). ``samples`` is the list the indices refer to."""

    samples: list[Sample]

    def capture(self, indices: list[int], width: int, device: torch.device) -> Capture: ...


@dataclass
class CaptureEntry:
    """One sample's capture, unpadded, on the CPU."""

    aux: torch.Tensor  # [seq, n_aux * hidden]
    last_hidden: torch.Tensor  # [seq, hidden]
    argmax: torch.Tensor  # [seq] long

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.aux, self.last_hidden, self.argmax))


class CaptureCache:
    """Per-sample captures, computed on first use and kept while under ``budget_bytes``."""

    def __init__(
        self,
        target: Target,
        samples: list[Sample],
        budget_bytes: int,
        autocast: contextlib.AbstractContextManager | None = None,
    ) -> None:
        self.target, self.samples, self.budget = target, samples, budget_bytes
        self.autocast = autocast or contextlib.nullcontext()
        self.entries: dict[int, CaptureEntry] = {}
        self.used, self.hits, self.misses = 0, 0, 0

    def _compute(self, index: int, device: torch.device) -> CaptureEntry:
        ids = torch.tensor([self.samples[index].input_ids], device=device)  # [1, seq]
        with self.autocast:
            cap = self.target.capture(ids)
        assert cap.logits is not None
        aux, last = cap.aux[0].cpu(), cap.last_hidden[0].cpu()
        return CaptureEntry(aux, last, cap.logits[0].argmax(-1).cpu())

    def entry(self, index: int, device: torch.device) -> CaptureEntry:
        hit = self.entries.get(index)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        fresh = self._compute(index, device)
        if self.used + fresh.nbytes <= self.budget:
            self.entries[index] = fresh
            self.used += fresh.nbytes
        return fresh

    def fill(self, device: torch.device) -> None:
        """Capture every sample now (the target's forwards), so training starts on hits;
        samples past the budget are computed and dropped, as ``entry`` does."""
        for index in range(len(self.samples)):
            self.entry(index, device)

    def capture(self, indices: list[int], width: int, device: torch.device) -> Capture:
        """Right-padded capture of the samples ``indices`` at ``width`` positions.

        Padding rows are zeros (argmax 0); the loss masks them out, and with right padding
        and causal attention they never reach a real position.
        """
        rows = [self.entry(i, device) for i in indices]
        return padded_capture(rows, width, self.target.model.get_output_embeddings(), device)


def padded_capture(
    rows: list[CaptureEntry], width: int, lm_head: nn.Module, device: torch.device
) -> Capture:
    """Stack per-sample entries into a right-padded batch of ``width`` positions.

    Example: rows of 3 and 5 positions, width 5 -> aux [2, 5, n_aux * hidden] whose row 0
    holds the first entry at positions 0..2 and zeros at 3..4.
    """
    first = rows[0]
    aux = first.aux.new_zeros((len(rows), width, first.aux.shape[-1]))  # [batch, seq, n_aux*h]
    last = first.last_hidden.new_zeros((len(rows), width, first.last_hidden.shape[-1]))
    arg = torch.zeros((len(rows), width), dtype=torch.long)  # [batch, seq]
    for r, e in enumerate(rows):
        n = e.aux.shape[0]
        aux[r, :n], last[r, :n], arg[r, :n] = e.aux, e.last_hidden, e.argmax
    return Capture(aux=aux.to(device), last_hidden=last.to(device), lm_head=lm_head,
                   argmax=arg.to(device))
