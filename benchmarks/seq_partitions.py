"""Sequence partitioning (models/training/partition.py): peak memory and time of one P-EAGLE
training step on one long sample, whole and in parts, side by side.

    python -m benchmarks.seq_partitions [--seqs 2048,4096] [--parts 1,2,4,8] [--steps 2]

Each (length, parts) row runs in its own process (peak RSS is per process), rows interleaved
by length. The sample: every built-in chat and completion, encoded with SmolLM2's template and
concatenated to the length (all tokens scored). The target's capture runs outside the timed
and measured step (it is the same in every row and the job caches it); the step is
``partition.backward`` over a P-EAGLE head (depth 4, COD 0.7, one layer) plus the optimiser.
`peak MiB` is the process's peak RSS after the steps minus before them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import time

import torch


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(seq: int, parts: int, steps: int) -> dict[str, float]:
    """The figures of one row, in this process."""
    from eaglenest.models.data import BUILTIN_NAMES, encode_examples, load_examples
    from eaglenest.models.heads.base import HeadBatch
    from eaglenest.models.heads.peagle import build
    from eaglenest.models.heads.registry import HEADS
    from eaglenest.models.prepare import cached_smollm2
    from eaglenest.models.target import load_target
    from eaglenest.models.training import partition
    from eaglenest.models.training.config import TrainConfig
    from eaglenest.models.training.distributed import LossFn
    from eaglenest.models.training.optim import make_optimizer

    torch.set_num_threads(2)
    target = load_target(cached_smollm2())
    examples = [e for name in BUILTIN_NAMES for e in load_examples(name)]
    ids: list[int] = []
    for sample in encode_examples(examples, target.tokenizer, 4096):
        ids += sample.input_ids
    x = torch.tensor([ids[:seq]])  # [1, seq]
    if x.shape[1] < seq:
        raise SystemExit(f"the built-in data holds {x.shape[1]} tokens, fewer than {seq}")
    batch = HeadBatch(x, torch.ones_like(x, dtype=torch.bool), torch.ones_like(x))
    kind = next(k for k, spec in HEADS.items() if spec.partitions)  # P-EAGLE
    config = TrainConfig(head=kind, seq_partitions=parts, parallel_depth=4, progress=False)
    torch.manual_seed(0)
    head = build(target, encode_examples(examples[:8], target.tokenizer, 512), config).train()
    with torch.no_grad():
        cap = target.capture(x, torch.ones_like(x))
    opt, _ = make_optimizer(head, config)
    loss_fn = LossFn(head, {"steps": 4, "decay": 1.0, "keep_prob": 0.7})
    before = _peak_mib()
    started = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        result = partition.backward(loss_fn, batch, cap, parts, contextlib.nullcontext, True)
        opt.step()
    seconds = (time.perf_counter() - started) / steps
    return {"seq": seq, "parts": parts, "step_s": seconds, "peak_mib": _peak_mib() - before,
            "loss": float(result.loss)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--seqs", default="2048,4096")
    p.add_argument("--parts", default="1,2,4,8")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--one", nargs=2, type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], args.steps)))
        return 0
    print("| tokens | parts | s per step | peak MiB over the start | loss |\n|---|---|---|---|---|")
    for seq in (int(s) for s in args.seqs.split(",")):
        for parts in (int(n) for n in args.parts.split(",")):
            out = subprocess.run([sys.executable, "-m", "benchmarks.seq_partitions", "--one",
                                  str(seq), str(parts), "--steps", str(args.steps)],
                                 capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"| {seq} | {parts} | {row['step_s']:.2f} | {row['peak_mib']:.0f} | "
                  f"{row['loss']:.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
