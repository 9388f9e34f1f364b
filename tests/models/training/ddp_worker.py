"""One rank of test_distributed.py, started by torchrun (2 processes, gloo on the CPU).

Usage: ``torchrun --standalone --nproc-per-node 2 ddp_worker.py TARGET_DIR ROOT``. The
process group is initialised here, before ``train()``, so this exercises the "group already
there" path (``eaglenest train --nproc`` exercises ``train()`` initialising it). Three
trainings run in the same group: ``ROOT/a`` straight to 4 steps, ``ROOT/b`` stopped after 2
with a checkpoint, then ``ROOT/b`` resumed to 4; then a P-EAGLE head trained whole and in 3
sequence partitions (models/training/partition.py: no_sync for all but the last part), with AdamW:
Muon orthogonalises each gradient, which blows the float-order differences of its smallest
singular directions up to the size of the update. Each rank saves its heads, histories and
the paths it asked ``save_head`` to write as ``ROOT/rank{r}.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import eaglenest.models.training.train as train_module
from eaglenest.models.data import encode_examples, load_examples
from eaglenest.models.data.template import Sample
from eaglenest.models.target import Target, load_target
from eaglenest.models.training.config import TrainConfig
from eaglenest.models.training.train import TrainData, train

STEPS = 4


def make_samples(target: Target) -> list[Sample]:
    """5 samples of 96 tokens with different numbers of scored positions."""
    return encode_examples(load_examples("gsm8k_training.jsonl")[:8], target.tokenizer, 96)


def config(out: Path | None, **kw: Any) -> TrainConfig:
    base: dict[str, Any] = dict(
        head="eagle3", max_steps=STEPS, batch_size=1, draft_vocab_size=64, lr=2e-3,
        warmup_steps=2, progress=False,
    )
    base.update(kw)
    return TrainConfig(out_dir=str(out) if out else None, **base)


def main(target_dir: str, root: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, out = dist.get_rank(), Path(root)
    writes: list[str] = []
    real_save = train_module.save_head

    def spy(head: Any, folder: Any, *args: Any, **kw: Any) -> Any:
        writes.append(str(folder))
        return real_save(head, folder, *args, **kw)

    train_module.save_head = spy  # type: ignore[assignment]  # records, then writes
    target = load_target(target_dir)
    data = TrainData(target, make_samples(target))
    runs = {
        "straight": train(config(out / "a"), data),
        "first": train(config(out / "b", checkpoint_every=2, stop_after=2), data),
        "resumed": train(config(out / "b", resume=True), data),
        "peagle whole": train(config(None, head="peagle", optimizer="adamw"), data),
        "peagle parts": train(config(None, head="peagle", optimizer="adamw",
                                     seq_partitions=3), data),
    }
    result: dict[str, Any] = {
        name: {"state": r.head.state_dict(), "history": r.history, "steps": r.steps}
        for name, r in runs.items()
    }
    result["writes"] = writes
    torch.save(result, out / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
