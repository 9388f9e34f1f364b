"""Which samples each training step takes: ``batch_stream(...)`` picks the order ``train()`` walks.

- ``BatchStream``: one seeded permutation of all samples per epoch, cut into global batches
  of ``batch_size * world_size`` (an incomplete last batch is dropped); under DDP rank r
  trains on the r-th contiguous share of each global batch (``distributed.shard``). Every
  single-process run, and every data-parallel run whose captures are not in shard files,
  walks this order.
- ``RankStream``: data-parallel training from capture shards (models/training/shard_source.py). The
  shard files are split between the ranks (``rank_shards``: contiguous, disjoint shares),
  and rank r's part of every global batch is drawn from its own shards' samples only, so a
  rank opens only its own shard files and its memory and disk reads scale with 1/ranks.

Contract of both: ``next_indices()`` returns the next global batch (rank 0's share first,
then rank 1's, ...; ``distributed.shard`` cuts it), ``state()`` / ``load_state()`` give
and restore the position, and the same seed and samples give the same batches.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from eaglenest.models.data.template import Sample
from eaglenest.models.training.distributed import Dist

log = logging.getLogger(__name__)


class BatchStream:
    """Deterministic batches: a seeded permutation per epoch, position kept for resume."""

    def __init__(self, samples: list[Sample], batch_size: int, seed: int) -> None:
        if not samples:
            raise ValueError("no training samples")
        self.samples, self.batch_size, self.seed = samples, min(batch_size, len(samples)), seed
        self.epoch, self.pos = 0, 0

    def _order(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(len(self.samples), generator=g).tolist()

    def next_indices(self) -> list[int]:
        if self.pos + self.batch_size > len(self.samples):
            self.epoch, self.pos = self.epoch + 1, 0
        idx = self._order()[self.pos : self.pos + self.batch_size]
        self.pos += self.batch_size
        return idx

    def next(self) -> list[Sample]:
        return [self.samples[i] for i in self.next_indices()]

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])


def rank_shards(num_shards: int, rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s contiguous share of the shards; shares are disjoint, cover all shards
    and differ by at most one shard.

    Example: 5 shards, 2 ranks -> rank 0: [0, 1], rank 1: [2, 3, 4] (r * n // w bounds).
    """
    if not 0 <= rank < world_size or num_shards < world_size:
        raise ValueError(f"{num_shards} shards cannot feed rank {rank} of {world_size}")
    return list(range(rank * num_shards // world_size, (rank + 1) * num_shards // world_size))


class RankStream:
    """Global batches in which each rank's share comes from its own shards' samples.

    ``groups[k]`` lists the sample indices stored in shard file k. Rank r owns the shards
    ``rank_shards(len(groups), r, world_size)`` and walks their samples as one endless
    stream: epoch e of rank r is a permutation of its samples seeded with (seed, e, r), and
    epoch e + 1 follows on directly (no batch is dropped, so every epoch of a rank trains
    on each of its samples exactly once; a batch that spans two epochs may hold a sample
    twice). Step k takes positions ``k*b .. k*b+b-1`` of every rank's stream, ``b`` the
    per-rank batch size (at most the smallest rank's sample count).

    Example: shards [[0, 1, 2], [3, 4], [5, 6]], 2 ranks, b = 2: rank 0 owns shard 0
    (samples 0, 1, 2), rank 1 shards 1 and 2 (samples 3..6). With epoch permutations, say,
    rank 0: [2, 0, 1] then [1, 2, 0], rank 1: [5, 3, 6, 4] then ..., step 1's global batch
    is [2, 0, 5, 3] (rank 0 trains on [2, 0], rank 1 on [5, 3]), step 2's [1, 1, 6, 4]
    (rank 0's batch ends epoch 0 and starts epoch 1). The ranks' epochs differ in length
    when their sample counts do; shares differ by at most one shard.
    """

    def __init__(self, groups: list[list[int]], batch_size: int, world_size: int,
                 seed: int) -> None:
        self.mine = [[i for k in rank_shards(len(groups), r, world_size) for i in groups[k]]
                     for r in range(world_size)]  # rank -> its samples, in index order
        self.batch_size = max(1, min(batch_size, *(len(m) for m in self.mine)))
        self.world_size, self.seed = world_size, seed
        self.total = sum(len(m) for m in self.mine)
        self.batches = 0  # global batches taken (the training step count)
        self._perms: dict[int, tuple[int, list[int]]] = {}  # rank -> (epoch, permutation)

    def _order(self, rank: int, epoch: int) -> list[int]:
        cached = self._perms.get(rank)
        if cached is None or cached[0] != epoch:
            g = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) * 1_009 + rank)
            cached = (epoch, torch.randperm(len(self.mine[rank]), generator=g).tolist())
            self._perms[rank] = cached
        return cached[1]

    def rank_batch(self, rank: int, k: int) -> list[int]:
        """Rank ``rank``'s samples in global batch ``k`` (0-based)."""
        n, out = len(self.mine[rank]), []
        for p in range(k * self.batch_size, (k + 1) * self.batch_size):
            out.append(self.mine[rank][self._order(rank, p // n)[p % n]])
        return out

    def next_indices(self) -> list[int]:
        k, self.batches = self.batches, self.batches + 1
        return [i for r in range(self.world_size) for i in self.rank_batch(r, k)]

    def state(self) -> dict[str, int]:
        """``batches`` is the position; ``epoch`` / ``pos`` count the samples taken as a
        ``BatchStream`` would (a checkpoint resumed in another layout starts near there)."""
        taken = self.batches * self.batch_size * self.world_size
        return {"epoch": taken // self.total, "pos": taken % self.total, "batches": self.batches}

    def load_state(self, state: dict[str, int]) -> None:
        if "batches" in state:
            self.batches = int(state["batches"])
        else:  # a BatchStream's position: the same number of samples taken
            taken = int(state["epoch"]) * self.total + int(state["pos"])
            self.batches = taken // (self.batch_size * self.world_size)


def batch_stream(samples: list[Sample], cache: Any, batch_size: int, seed: int,
                 place: Dist) -> BatchStream | RankStream:
    """The order ``train()`` walks: a ``RankStream`` when several ranks train from a
    capture source whose samples are ``samples`` and that lists its shard files' samples
    (``cache.groups``, models/training/shard_source.py) with at least one shard per rank; else a
    ``BatchStream`` of ``batch_size * world_size`` (one process: always)."""
    groups = getattr(cache, "groups", None)
    if place.enabled and groups is not None and getattr(cache, "samples", None) is samples:
        if len(groups) >= place.world_size:
            return RankStream(groups, batch_size, place.world_size, seed)
        log.warning("%d capture shards for %d ranks: every rank reads every shard (use "
                    "smaller shards)", len(groups), place.world_size)
    return BatchStream(samples, batch_size * place.world_size, seed)
