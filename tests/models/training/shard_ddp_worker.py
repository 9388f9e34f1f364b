"""One rank of test_shard_ddp.py, started by torchrun (2 processes, gloo on the CPU).

Usage: ``torchrun --standalone --nproc-per-node 2 shard_ddp_worker.py CAPTURE ROOT STEPS``.
Trains an EAGLE-3 head from the capture shards in CAPTURE (``shard_train_data``, as a
job's ranks do) for STEPS steps of one sample per rank, recording the files
models/training/shard_source.py reads (every read goes through its ``load_file`` or, for the
samples file, models/capture/shards.py's) and the sample
indices the rank asks the shards for; saves them with the head and the history as
``ROOT/rank{r}.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from eaglenest.models.capture import shards
from eaglenest.models.training import shard_source
from eaglenest.models.training.config import TrainConfig
from eaglenest.models.training.shard_source import shard_train_data
from eaglenest.models.training.train import train


def main(capture: str, root: str, steps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    opened: list[str] = []
    real_load = shard_source.load_file

    def load_file(path: Any, *args: Any, **kw: Any) -> Any:
        opened.append(Path(path).name)
        return real_load(path, *args, **kw)

    shard_source.load_file = load_file  # type: ignore[assignment]  # records, then reads
    shards.load_file = load_file  # type: ignore[assignment]
    data = shard_train_data(capture)
    asked: list[list[int]] = []
    real_capture = data.cache.capture  # type: ignore[union-attr]

    def capture_spy(indices: list[int], width: int, device: torch.device) -> Any:
        asked.append(list(indices))
        return real_capture(indices, width, device)

    data.cache.capture = capture_spy  # type: ignore[union-attr, method-assign]
    config = TrainConfig(head="eagle3", max_steps=steps, batch_size=1, draft_vocab_size=64,
                         lr=2e-3, warmup_steps=2, progress=False)
    result = train(config, data)
    torch.save({"opened": opened, "asked": asked, "state": result.head.state_dict(),
                "history": result.history}, Path(root) / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
