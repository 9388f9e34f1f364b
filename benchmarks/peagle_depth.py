"""Is P-EAGLE's later-position accuracy limited by the head's depth? Equal steps, 1 vs N layers.

    python -m benchmarks.peagle_depth [--steps 240] [--layers 1,2] [--eagle3] [--out DIR]

vLLM's P-EAGLE format fixes what a mask slot sees: the token `mask_token_id` and the hidden
state `mask_hidden`, the same for every slot. In a one-layer head the slot's attention query
is therefore the same vector everywhere (only RoPE turns it), so what it reads from the
context is chosen by the keys alone, and its prediction of x[t+2+k] comes from one
attention read of 64-wide value heads. A second layer gives the mask slot a query that
depends on the context (the first layer's output) and values that already carry the first
layer's prediction. If depth is the limit, a deeper head reaches a much higher mask-slot
accuracy at the same number of steps, on the training samples as well as held out.

Data: the built-in datasets' own answers (no regeneration, so no vLLM is needed), the last
2 examples of every file held out, as benchmarks.train_heads splits them; SmolLM2-135M
target; batch 2, 512 tokens, the default recipe. Reported: teacher-forced draft accuracy per
depth (depth 0 is the first draft, from the real slot; depths 1+ are mask slots), every
slot kept (no drop-token), on 16 training samples and on the held-out samples, plus steps
and CPU seconds. `--eagle3` adds a one-layer EAGLE-3 head (training-time test, chained) for
reference. For P-EAGLE heads also: how often a mask slot's greedy draft (held-out samples)
is the same token as the first mask slot's of the same anchor, per depth 2-5.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.head_bench import split_builtin, train_config
from benchmarks.train_heads import prepared_target
from eaglenest.models.capture.cache import CaptureCache
from eaglenest.models.data import Sample, encode_examples
from eaglenest.models.heads.base import HeadBatch
from eaglenest.models.heads.registry import EAGLE3, HEADS, PEAGLE
from eaglenest.models.target import Capture, Target, load_target
from eaglenest.models.training.train import TrainData, collate, train


def _cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _batches(target: Target, samples: list[Sample]) -> Iterator[tuple[HeadBatch, Capture]]:
    """Batches of 4 samples with the target's capture of each."""
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    for i in range(0, len(samples), 4):
        batch = collate(samples[i:i + 4], pad, "cpu")
        yield batch, target.capture(batch.input_ids, batch.attention_mask)


def accuracy(head: torch.nn.Module, target: Target, samples: list[Sample],
             depth: int) -> list[float]:
    """Mean teacher-forced accuracy per depth over batches of 4, every slot kept."""
    accs = []
    extra = {"keep_prob": 1.0} if hasattr(head, "parallel_forward") else {}
    with torch.no_grad():
        for batch, cap in _batches(target, samples):
            loss = head.loss(batch, cap, steps=depth, **extra)  # type: ignore[operator]
            accs.append(loss.step_accuracy)
    return [sum(a[j] for a in accs) / len(accs) for j in range(depth)]


def same_draft(head: torch.nn.Module, target: Target, samples: list[Sample],
               depth: int) -> list[float]:
    """P-EAGLE: per mask slot k >= 1 (depths 2..), the share of anchors at assistant tokens
    whose greedy draft there is the same token as at the first mask slot (1.0 for it)."""
    same, count = [0.0] * depth, 0
    with torch.no_grad():
        for batch, cap in _batches(target, samples):
            keep = torch.ones(depth, batch.input_ids.shape[1], dtype=torch.bool)
            logits = head.parallel_forward(batch.input_ids, cap.aux, depth, keep)  # type: ignore[operator]
            drafts = [x.argmax(-1) for x in logits]  # per depth [batch, seq]
            valid = batch.loss_mask.bool()
            count += int(valid.sum())
            for k in range(1, depth):
                same[k] += float(((drafts[k] == drafts[1]) & valid).sum())
    return [s / max(count, 1) for s in same][1:]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--layers", default="1,2")
    p.add_argument("--eagle3", action="store_true")
    p.add_argument("--depth", type=int, default=5, help="P-EAGLE drafts per forward")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    target = load_target(prepared_target())
    train_ex, held_ex = split_builtin(2)
    samples = encode_examples(train_ex, target.tokenizer, 512)
    held = encode_examples(held_ex, target.tokenizer, 512)
    probe = samples[:: max(1, len(samples) // 16)][:16]
    data = TrainData(target, samples, "builtin")
    data.cache = CaptureCache(target, samples, 8 << 30)
    runs = [(PEAGLE.kind, int(n)) for n in args.layers.split(",")]
    runs += [(EAGLE3.kind, 1)] if args.eagle3 else []
    rows: list[dict[str, Any]] = []
    print(f"{len(samples)} training samples, {len(held)} held out; {args.steps} steps each",
          flush=True)
    for kind, layers in runs:
        cpu0 = _cpu()
        config = train_config(kind, max_steps=args.steps, num_layers=layers,
                              parallel_depth=args.depth)
        result = train(config, data)
        cpu = _cpu() - cpu0
        head = result.head.eval()
        row = {"head": kind, "layers": layers, "steps": result.steps, "cpu_s": round(cpu),
               "train": accuracy(head, target, probe, args.depth),
               "held_out": accuracy(head, target, held, args.depth)}
        if HEADS[kind].parallel:
            row["same_draft_as_depth2"] = same_draft(head, target, held, args.depth)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("| head | layers | steps | CPU s | accuracy per depth, training samples | held out |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['head']} | {r['layers']} | {r['steps']} | {r['cpu_s']} | "
              + "/".join(f"{a:.2f}" for a in r["train"]) + " | "
              + "/".join(f"{a:.2f}" for a in r["held_out"]) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
