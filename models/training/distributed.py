"""Data-parallel head training on the GPUs of one host (torchrun + DistributedDataParallel).

``train(config, data, device)`` calls :func:`setup` first. Outside torchrun (no
``WORLD_SIZE`` > 1 in the environment and no initialised process group) it is a no-op and
training runs in one process exactly as before. Under ``torchrun --nproc-per-node N`` each
process joins the group (NCCL on ``cuda:LOCAL_RANK``, gloo on the CPU; a group the caller
already initialised is used as it is), builds the same head from the same seed and the
same samples (the draft vocabulary counts every sample, so it is identical on every rank),
and wraps it in DDP, which broadcasts rank 0's parameters at construction and all-reduces
(averages) the gradients during ``backward()``.

Who trains on what (:func:`shard`): the stream (models/training/batches.py ``batch_stream``) yields
a *global* batch of ``batch_size * world_size`` indices; rank r takes the r-th contiguous
share. Which stream: training from capture shards (models/training/shard_source.py) uses
``RankStream``, whose rank r share is drawn from rank r's own shard files only (a
deterministic seeded order per rank, see its docstring), so no two ranks open the same
shard file; every other run uses ``BatchStream``, one global order, as below.

``BatchStream`` example: 10 samples, ``batch_size=2``, 2 ranks: the epoch order is a seeded
permutation, say ``[7, 2, 9, 0, 4, 1, 8, 3, 6, 5]``; step 1's global batch is ``[7, 2, 9,
0]``, rank 0 trains on ``[7, 2]`` and rank 1 on ``[9, 0]``; step 2 is ``[4, 1, 8, 3]`` ->
``[4, 1]`` / ``[8, 3]``; ``[6, 5]`` do not fill a global batch, so the epoch ends there
(as a single process drops an incomplete batch), and step 3 starts epoch 1's permutation.
The stream position saved in checkpoints is this global position, so a resumed run
continues with the same batches (and a one-process run with ``batch_size=4`` walks the
same global batches; not so with ``RankStream``, whose order depends on the number of
ranks, and which a resumed run with the same ranks also continues exactly).

What the gradients mean: every head's loss is a masked mean over the scored positions of
its own batch, and DDP averages the ranks' gradients, so an N-rank step optimises the mean
of the N per-rank losses. That equals one process on the union batch only when every rank
scores the same number of positions; tests/models/training/test_distributed.py checks the exact
property (DDP == one process averaging the per-share gradients).

Only rank 0 writes (checkpoints, the head, provenance) and shows progress. Logged loss and
accuracy are the all-reduced means over ranks, identical on every rank. Decisions to stop
early (``should_stop``, ``max_seconds``) are all-reduced (any rank -> all ranks) before
each step, so no rank is left waiting in a collective. Checkpoints hold every rank's RNG
state, so a resumed run with the same number of ranks continues exactly.

Not done here: FSDP (heads are small: one decoder layer plus a draft-vocabulary lm_head,
so plain DDP replication fits any GPU that holds the target) and multi-host launch (torchrun
``--nnodes`` should work unchanged but is untested). Tested on the CPU with gloo only; the
NCCL / ``cuda:LOCAL_RANK`` path has not run on a multi-GPU host yet.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from eaglenest.models.heads.base import HeadBatch, HeadLoss, Partition
from eaglenest.models.heads.registry import HEADS
from eaglenest.models.target import Capture


def _head_loss(head: nn.Module) -> Callable[..., HeadLoss]:
    return cast(Callable[..., HeadLoss], head.loss)


@dataclass(frozen=True)
class Dist:
    """This process's place in the group; the default is a single process."""

    rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def under_launcher() -> bool:
    """True when started by torchrun with more than one process."""
    return _env_int("WORLD_SIZE", 1) > 1


def torchrun_argv(nproc: int) -> list[str]:
    """The command prefix that starts ``nproc`` ranks on this host; append ``-m module ...``.

    ``python -m torch.distributed.run`` rather than the ``torchrun`` script: a pyenv shim
    is a shell script and the launcher re-executes ``sys.executable`` anyway."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}"]


def local_device(device: str | torch.device) -> torch.device:
    """The device this rank uses: plain ``cuda`` becomes ``cuda:LOCAL_RANK`` under torchrun.

    Load the target there too (``eaglenest.models.commands`` does): captures run where the
    target is.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and (under_launcher() or _initialised()):
        return torch.device("cuda", _env_int("LOCAL_RANK", 0))
    return device


def _initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def setup(device: str | torch.device) -> tuple[Dist, torch.device]:
    """Join the process group if this is a multi-process run; returns (place, device)."""
    device = local_device(device)
    if not _initialised():
        if not under_launcher():
            return Dist(), device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # env:// rendezvous: torchrun sets MASTER_ADDR/PORT, RANK and WORLD_SIZE
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    elif device.type == "cuda":
        torch.cuda.set_device(device)
    place = Dist(dist.get_rank(), dist.get_world_size())
    return place, device


def shutdown() -> None:
    """Leave the process group (the CLI calls this before exiting)."""
    if _initialised():
        dist.destroy_process_group()


def shard(indices: list[int], place: Dist) -> list[int]:
    """Rank r's contiguous share of a global batch (see the module docstring).

    Shares differ by at most one when the global batch does not split evenly (a dataset
    smaller than ``batch_size * world_size``); every rank needs at least one sample.
    """
    if not place.enabled:
        return indices
    n, w, r = len(indices), place.world_size, place.rank
    if n < w:
        raise ValueError(f"{n} training samples cannot feed {w} processes")
    return indices[r * n // w : (r + 1) * n // w]


class _LossModule(nn.Module):
    """DDP hooks ``forward()`` only: this adapter's forward is the head's training loss."""

    def __init__(self, head: nn.Module, kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.head, self.kwargs = head, kwargs
        self.last: HeadLoss | None = None

    def forward(self, batch: HeadBatch, cap: Capture, extra: dict[str, Any]) -> torch.Tensor:
        self.last = _head_loss(self.head)(batch, cap, **self.kwargs, **extra)
        return self.last.loss  # a bare tensor: DDP's output hooks see exactly the loss


class LossFn:
    """``loss_fn(batch, capture, partition=None) -> HeadLoss`` whose ``loss.backward()``
    averages gradients over the ranks (DDP) when there are several. A backward inside
    ``no_sync()`` keeps its gradients local: all but the last part of a partitioned step
    (models/training/partition.py), whose backward then averages the parts' sum."""

    def __init__(self, head: nn.Module, kwargs: dict[str, Any],
                 ddp: DistributedDataParallel | None = None,
                 adapter: _LossModule | None = None) -> None:
        self.head, self.kwargs, self.ddp, self.adapter = head, kwargs, ddp, adapter

    def __call__(self, batch: HeadBatch, cap: Capture,
                 partition: Partition | None = None) -> HeadLoss:
        extra = {} if partition is None else {"partition": partition}
        if self.ddp is None:
            return _head_loss(self.head)(batch, cap, **self.kwargs, **extra)
        loss = self.ddp(batch, cap, extra)
        assert self.adapter is not None and self.adapter.last is not None
        return replace(self.adapter.last, loss=loss)

    def no_sync(self) -> contextlib.AbstractContextManager[Any]:
        return self.ddp.no_sync() if self.ddp is not None else contextlib.nullcontext()


def loss_fn(
    head: nn.Module, kwargs: dict[str, Any], place: Dist, device: torch.device, kind: str
) -> LossFn:
    """The head's training loss (LossFn), under DDP when there are several ranks."""
    if not place.enabled:
        return LossFn(head, kwargs)
    adapter = _LossModule(head, kwargs)
    ddp = DistributedDataParallel(  # broadcasts rank 0's parameters and buffers now
        adapter,
        device_ids=[device.index] if device.type == "cuda" else None,
        forward_sync_buffers=False,  # the buffers (d2t / t2d) never change
        find_unused_parameters=HEADS[kind].unused_parameters,
    )
    return LossFn(head, kwargs, ddp, adapter)


def agree(flag: bool, place: Dist, device: torch.device) -> bool:
    """True on every rank if it is true on any (stop decisions)."""
    if not place.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def mean(values: list[float], place: Dist, device: torch.device) -> list[float]:
    """Element-wise mean over ranks (logged loss / accuracy)."""
    if not place.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t / place.world_size).tolist()


def total(value: int, place: Dist, device: torch.device) -> int:
    if not place.enabled:
        return value
    t = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(t)
    return int(t.item())


def gather(obj: Any, place: Dist) -> list[Any]:
    """Every rank's ``obj``, in rank order (a collective: all ranks must call it)."""
    if not place.enabled:
        return [obj]
    out: list[Any] = [None] * place.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(place: Dist) -> None:
    if place.enabled:
        dist.barrier()
