"""Where a head's acceptance is lost: its teacher-forced per-step draft accuracy on training
samples vs held-out samples (the job's split of the built-in datasets: `--holdout` examples
spread through them are held out), both with the assistant turns regenerated greedily by the
target, as the job trains. A large gap is over-fitting; a step whose accuracy falls off
was not trained (training-time-test steps < the K served).

    python -m benchmarks.head_accuracy --head DIR [--target DIR] [--holdout 8]
                                       [--train-samples 16] [--steps 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from eaglenest.models.checkpoint import load_head
from eaglenest.models.data import (
    BUILTIN_NAMES,
    Sample,
    builtin_path,
    encode_examples,
    load_examples,
)
from eaglenest.models.data.regenerate import regenerate
from eaglenest.models.data.split import held_out_split
from eaglenest.models.target import Target, load_target
from eaglenest.models.training.train import collate

DEFAULT_TARGET = Path.home() / ".cache" / "eaglenest" / "smollm2-135m-instruct"


def step_accuracy(head: torch.nn.Module, target: Target, samples: list[Sample],
                  steps: int) -> tuple[list[float], int]:
    """Mean step accuracy over batches of 4 (each batch's mean weighted equally), tokens."""
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    accs: list[list[float]] = []
    tokens = 0
    with torch.no_grad():
        for i in range(0, len(samples), 4):
            batch = collate(samples[i:i + 4], pad, "cpu")
            cap = target.capture(batch.input_ids, batch.attention_mask)
            accs.append(head.loss(batch, cap, steps=steps).step_accuracy)  # type: ignore[operator]
            tokens += int(batch.loss_mask.sum())
    return [sum(a[j] for a in accs) / len(accs) for j in range(steps)], tokens


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--head", type=Path, required=True)
    p.add_argument("--target", type=Path, default=DEFAULT_TARGET)
    p.add_argument("--holdout", type=int, default=8)
    p.add_argument("--train-samples", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    target = load_target(args.target, device="cpu")
    head = load_head(args.head, target.embed_weight(), target.lm_head_weight()).eval()
    examples = [e for n in BUILTIN_NAMES for e in load_examples(builtin_path(n))]
    train, held, _ = held_out_split(examples, args.holdout)  # the job's split
    picked = train[:: max(1, len(train) // args.train_samples)][: args.train_samples]
    for name, group in (("train", picked), ("held-out", held)):
        samples = encode_examples(regenerate(group, target), target.tokenizer, 512)
        acc, tokens = step_accuracy(head, target, samples, args.steps)
        print(f"{name:<9} {len(samples):>3} samples {tokens:>6} tokens  step accuracy "
              + " ".join(f"{a:.3f}" for a in acc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
