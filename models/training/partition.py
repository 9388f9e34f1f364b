"""Sequence partitioning: one training step's loss taken over parts of its anchor slots, a
backward per part, so a long sample trains within the memory of one part.

``backward(loss_fn, batch, cap, parts, autocast, partitioned)`` calls the head's loss once
per part (``Partition(index, parts, seed)``, models/heads/base.py): each part scores its own
anchors, normalised as the whole batch, and every part draws the same random slot choices
from the step's ``seed``; the gradients accumulate in the parameters, so after the last
backward they are the whole step's (up to float summation order), and training with any
number of parts follows the same path (tests/models/training/test_partition.py). Heads whose loss
takes ``partition`` (HeadSpec.partitions) always get one, ``Partition(0, 1, seed)`` when
unpartitioned; other heads' loss runs as it is. Under DDP all but the last part's backward
run in ``no_sync()``: one all-reduce a step, as without partitions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from eaglenest.models.heads.base import HeadBatch, HeadLoss, Partition
from eaglenest.models.target import Capture
from eaglenest.models.training.distributed import LossFn


def backward(loss_fn: LossFn, batch: HeadBatch, cap: Capture, parts: int,
             autocast: Callable[[], contextlib.AbstractContextManager[object]],
             partitioned: bool) -> HeadLoss:
    """The step's HeadLoss after ``loss.backward()`` of each of its ``parts`` parts
    (``partitioned``: the head's loss takes them; else the loss as it is, one backward)."""
    if not partitioned:
        with autocast():
            result = loss_fn(batch, cap)
        result.loss.backward()
        return result
    seed = int(torch.randint(0, 2**62, (1,)))  # one draw of the global RNG a step
    results = []
    for index in range(parts):
        sync = contextlib.nullcontext() if index == parts - 1 else loss_fn.no_sync()
        with sync:
            with autocast():
                part = loss_fn(batch, cap, Partition(index, parts, seed))
            part.loss.backward()
        results.append(part)
    return merged(results)


def merged(results: list[HeadLoss]) -> HeadLoss:
    """One HeadLoss of a step's parts: losses summed (each part is normalised as the whole
    step), accuracies weighted by the positions each part scored.

    Example: parts scoring 3 and 1 positions at depth 0 with accuracy 1.0 and 0.0 -> 0.75."""
    loss = torch.stack([r.loss.detach() for r in results]).sum()
    depth = len(results[0].step_losses)
    counts = [sum(r.step_counts[j] for r in results) for j in range(depth)]
    return HeadLoss(
        loss=loss,
        step_losses=[sum(r.step_losses[j] for r in results) for j in range(depth)],
        step_accuracy=[sum(r.step_accuracy[j] * r.step_counts[j] for r in results)
                       / max(counts[j], 1) for j in range(depth)],
        step_counts=counts,
    )
