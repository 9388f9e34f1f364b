"""Data-parallel training from capture shards (models/training/batches.py ``RankStream``): 2 ranks
under torchrun (gloo, CPU) read disjoint sets of shard files and together train on every
sample once per epoch, in the deterministic seeded order; both end with the same head.

The capture: the 12 test samples in shards of 5 (5 + 5 + 2), so rank 0 owns shard 0
(samples 0..4) and rank 1 shards 1 and 2 (samples 5..11). 7 steps of one sample per rank
walk rank 1's first epoch and rank 0's first epoch plus 2 samples of its second.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from eaglenest.models.capture.shards import shard_name, write_shards
from eaglenest.models.training.batches import RankStream
from eaglenest.models.training.config import TrainConfig
from eaglenest.models.training.shard_source import ShardSource, ShardTarget
from tests.models.training.test_distributed import _env

HERE = Path(__file__).parent
STEPS = 7


@pytest.fixture(scope="module")
def ranks(llama, samples, tmp_path_factory: pytest.TempPathFactory) -> Any:  # noqa: ANN001
    """(capture folder, [rank 0 record, rank 1 record]) of one torchrun of the worker."""
    capture, root = tmp_path_factory.mktemp("capture"), tmp_path_factory.mktemp("ranks")
    write_shards(llama, samples, capture, samples_per_shard=5)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2", str(HERE / "shard_ddp_worker.py"), str(capture), str(root),
           str(STEPS)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return capture, [torch.load(root / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def test_ranks_read_disjoint_shard_files(ranks: Any) -> None:
    _, (r0, r1) = ranks
    shards = [{f for f in r["opened"] if "shard-" in f} for r in (r0, r1)]
    assert shards == [{shard_name(0)}, {shard_name(1), shard_name(2)}]
    for r in (r0, r1):  # besides its shards: the samples file and the target's two ends
        assert {f for f in r["opened"] if "shard-" not in f} == {"samples.safetensors",
                                                                  "ends.safetensors"}


def test_ranks_cover_every_sample_once_per_epoch(ranks: Any) -> None:
    _, (r0, r1) = ranks
    seen = [[i for batch in r["asked"] for i in batch] for r in (r0, r1)]
    assert [len(s) for s in seen] == [STEPS, STEPS]  # one sample per rank and step
    assert sorted(seen[0][:5]) == [0, 1, 2, 3, 4]  # rank 0's first epoch
    assert sorted(seen[1][:7]) == [5, 6, 7, 8, 9, 10, 11]  # rank 1's
    assert sorted(seen[0][:5] + seen[1][:7]) == list(range(12))  # together: all, once
    assert set(seen[0][5:]) <= {0, 1, 2, 3, 4}  # epoch 1 of rank 0: still its own


def test_the_order_is_the_seeded_rank_stream_and_ranks_agree(ranks: Any) -> None:
    capture, (r0, r1) = ranks
    groups = ShardSource(capture, ShardTarget(capture)).groups
    stream = RankStream(groups, 1, 2, TrainConfig().seed)
    expected = [stream.next_indices() for _ in range(STEPS)]
    assert r0["asked"] == [[b[0]] for b in expected]
    assert r1["asked"] == [[b[1]] for b in expected]
    for k, v in r0["state"].items():  # DDP: the same head on both ranks
        assert torch.equal(v, r1["state"][k]), k
    assert [h["loss"] for h in r0["history"]] == [h["loss"] for h in r1["history"]]
