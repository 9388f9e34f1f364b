"""Run ``speculators train`` (0.9.0) on a CPU-only torch; runs in the speculators venv.

    python train_cpu.py --stats STATS.json [--threads N] <flags of `speculators train`>

Needs, besides ``--max-steps``: ``--loss-implementation eager`` (the fused loss is Triton),
``--draft-attn-impl sdpa`` (the default flex attention has no CPU backward) and
``--num-workers 0``. The patches, all in speculators/train/trainer.py:

1. ``_StepTimer`` calls ``torch.accelerator.synchronize()`` on every logged step
   (trainer.py:80, :92), which raises "Cannot access accelerator device when none is
   available" on CPU: made a no-op when no accelerator exists.
2. ``self.local_rank = get_local_rank()`` (trainer.py:221) is the int 0, used as a device in
   ``model.to(...)`` (:348) and ``batch[k].to(...)`` (:533, :643), i.e. cuda:0: the trainer
   module's ``get_local_rank`` returns the CPU device instead.
3. ``device_type`` falls back to "cuda" without an accelerator (trainer.py:228), so
   ``torch.autocast(self.device_type, ...)`` never applies to CPU tensors: set to "cpu"
   (with ``--hidden-states-dtype float32`` CPU autocast then disables itself: plain fp32).
4. ``--max-steps`` only breaks the current epoch (trainer.py:601-605); ``run_training``
   (trainer.py:733-764) then starts every remaining epoch, each running one more step,
   saving a checkpoint and validating. Replaced by: train epochs until ``max_steps``
   optimizer steps are done, then save one checkpoint to ``<save-path>/final`` (no
   validation pass). The LR schedule already spans ``max_steps`` (trainer.py:183-184).

It also records, through a forward pre-hook on the draft model, the real tokens
(``document_ids != -1``) and loss tokens of every training step, and writes them with the
training loop's wall and CPU seconds to ``--stats``.
"""

import json
import sys
import time
from pathlib import Path

import torch

_sync = torch.accelerator.synchronize
torch.accelerator.synchronize = lambda *a, **k: (  # patch 1
    _sync(*a, **k) if torch.accelerator.is_available() else None)

import speculators.train.trainer as T  # noqa: E402
from speculators.train.cli import main  # noqa: E402
from speculators.train.config import TrainConfig  # noqa: E402

T.get_local_rank = lambda: torch.device("cpu")  # patch 2
STATS: dict = {"step_tokens": [], "step_loss_tokens": []}
_init = T.Trainer.__init__


def _patched_init(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
    _init(self, *a, **k)
    self.device_type = "cpu"  # patch 3

    def count(module, args, kwargs):  # noqa: ANN001, ANN202
        if module.training:
            STATS["step_tokens"].append(int((kwargs["document_ids"] != -1).sum()))
            STATS["step_loss_tokens"].append(int(kwargs["loss_mask"].sum()))

    self.model.register_forward_pre_hook(count, with_kwargs=True)


def _run_training(self):  # noqa: ANN001, ANN202 - patch 4
    if self.config.max_steps is None:
        raise SystemExit("train_cpu.py needs --max-steps")
    t0, c0 = time.perf_counter(), time.process_time()
    epoch = self.current_epoch
    while self.global_step < self.config.max_steps:
        self.train_epoch(epoch)
        epoch += 1
    STATS.update(loop_wall_s=time.perf_counter() - t0, loop_cpu_s=time.process_time() - c0,
                 steps=self.global_step, epochs=epoch - self.current_epoch,
                 steps_per_epoch=len(self.train_loader))
    self.checkpointer.save_checkpoint(self.model, self.optimizers, "final")
    STATS["checkpoint"] = str(self.checkpointer.path / "final")


T.Trainer.__init__ = _patched_init
T.Trainer.run_training = _run_training


def _pop_flag(argv: list[str], flag: str, default: str) -> str:
    if flag not in argv:
        return default
    i = argv.index(flag)
    value = argv[i + 1]
    del argv[i : i + 2]
    return value


if __name__ == "__main__":
    argv = sys.argv[1:]
    stats_path = Path(_pop_flag(argv, "--stats", "train_stats.json"))
    torch.set_num_threads(int(_pop_flag(argv, "--threads", str(torch.get_num_threads()))))
    t_start, c_start = time.perf_counter(), time.process_time()
    main(TrainConfig.resolve(argv))
    STATS.update(total_wall_s=time.perf_counter() - t_start,
                 total_cpu_s=time.process_time() - c_start, threads=torch.get_num_threads())
    stats_path.write_text(json.dumps(STATS, indent=1))
    print(json.dumps({k: v for k, v in STATS.items() if not k.startswith("step_")}))
