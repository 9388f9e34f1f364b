"""The training order (models/training/batches.py): ``RankStream`` keeps each rank to its own shard
files, covers every sample once per rank epoch, is deterministic and resumes exactly;
``batch_stream`` picks it only for several ranks training from shards."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from eaglenest.models.training.batches import BatchStream, RankStream, batch_stream, rank_shards
from eaglenest.models.training.distributed import Dist

GROUPS = [[0, 1, 2], [3, 4], [5, 6]]  # sample indices per shard file


def _walk(stream: RankStream, steps: int) -> list[list[int]]:
    """Per rank, the samples it trained on in ``steps`` steps, in order."""
    b, out = stream.batch_size, [[] for _ in range(stream.world_size)]
    for _ in range(steps):
        batch = stream.next_indices()
        for r in range(stream.world_size):
            out[r] += batch[r * b : (r + 1) * b]
    return out


def test_each_rank_draws_from_its_own_shards_and_covers_them_every_epoch() -> None:
    stream = RankStream(GROUPS, batch_size=2, world_size=2, seed=3)
    assert stream.mine == [[0, 1, 2], [3, 4, 5, 6]]
    ranks = _walk(stream, 6)  # 12 positions per rank: rank 0 4 epochs, rank 1 3
    for own, seen in zip(stream.mine, ranks, strict=True):
        n = len(own)
        for e in range(len(seen) // n):  # each epoch: every own sample exactly once
            assert sorted(seen[e * n : (e + 1) * n]) == own
    first_epochs = ranks[0][:3] + ranks[1][:4]
    assert sorted(first_epochs) == list(range(7))  # together: every sample once


def test_the_order_is_deterministic_and_seeded() -> None:
    a = _walk(RankStream(GROUPS, 2, 2, seed=3), 5)
    assert a == _walk(RankStream(GROUPS, 2, 2, seed=3), 5)
    assert a != _walk(RankStream(GROUPS, 2, 2, seed=4), 5)


def test_resume_continues_exactly() -> None:
    straight = RankStream(GROUPS, 2, 2, seed=0)
    expected = [straight.next_indices() for _ in range(5)]
    first = RankStream(GROUPS, 2, 2, seed=0)
    for _ in range(2):
        first.next_indices()
    state = first.state()
    assert state == {"epoch": 1, "pos": 1, "batches": 2}  # 8 samples taken of 7
    resumed = RankStream(GROUPS, 2, 2, seed=0)
    resumed.load_state(state)
    assert [resumed.next_indices() for _ in range(3)] == expected[2:]
    legacy = RankStream(GROUPS, 2, 2, seed=0)  # a BatchStream's position: 8 samples taken
    legacy.load_state({"epoch": 1, "pos": 1})
    assert legacy.batches == 2


def test_batch_size_is_capped_by_the_smallest_share() -> None:
    assert RankStream(GROUPS, 8, 2, seed=0).batch_size == 3
    assert rank_shards(3, 1, 2) == [1, 2]


def test_batch_stream_picks_rank_stream_only_for_ranks_on_shards(
    caplog: pytest.LogCaptureFixture,
) -> None:
    samples = list(range(7))
    source = SimpleNamespace(samples=samples, groups=GROUPS)
    one = batch_stream(samples, source, 2, 0, Dist())  # type: ignore[arg-type]
    assert isinstance(one, BatchStream) and one.batch_size == 2  # one process: as always
    two = batch_stream(samples, source, 2, 0, Dist(1, 2))  # type: ignore[arg-type]
    assert isinstance(two, RankStream) and two.batch_size == 2
    other = SimpleNamespace(samples=list(samples), groups=GROUPS)  # not these samples
    assert isinstance(batch_stream(samples, other, 2, 0, Dist(0, 2)), BatchStream)  # type: ignore[arg-type]
    assert isinstance(batch_stream(samples, None, 2, 0, Dist(0, 2)), BatchStream)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        few = batch_stream(samples, source, 1, 0, Dist(0, 4))  # type: ignore[arg-type]
    assert isinstance(few, BatchStream) and few.batch_size == 4
    assert "3 capture shards for 4 ranks" in caplog.text
