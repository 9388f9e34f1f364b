"""Regeneration speed: the same examples rewritten by the target with left-padded `generate`
batches (the way before continuous batching, still the path of recurrent targets) and with
continuous batching (models/data/regenerate.py), side by side in one run.

    python -m benchmarks.regenerate_speed [--target DIR] [--datasets a.jsonl,b.jsonl]
        [--generate-batch 8] [--rows 32] [--max-new-tokens 256] [--threads 2]

Default data: the README's train.jsonl (every built-in dataset, in order). Each row is one
pass over every assistant turn of every example, greedy; `same text` compares each turn's
text with the first row's (greedy output may differ only by float rounding in the batched
matmuls).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from eaglenest.models.data import BUILTIN_NAMES, Chat, Example, load_examples
from eaglenest.models.data.regenerate import regenerate
from eaglenest.models.prepare import cached_smollm2
from eaglenest.models.target import load_target


def answers(examples: list[Example]) -> list[str]:
    """Every assistant turn's text, in order."""
    out: list[str] = []
    for e in examples:
        if isinstance(e, Chat):
            out += [m["content"] for m in e.messages if m["role"] == "assistant"]
        else:
            out.append(e.completion)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", type=Path, default=None, help="default: SmolLM2 (cached)")
    p.add_argument("--datasets", default=",".join(BUILTIN_NAMES))
    p.add_argument("--generate-batch", type=int, default=8)
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = load_target(args.target or cached_smollm2())
    examples = [e for name in args.datasets.split(",") for e in load_examples(name.strip())]
    rows = [("generate batches", args.generate_batch, False),
            ("continuous batching", args.rows, True)]
    print("| decoding | rows | turns | answer tokens | seconds | answer tok/s | vs first | "
          "same text |\n|---|---|---|---|---|---|---|---|")
    first: tuple[float, list[str]] | None = None
    for name, size, continuous in rows:
        started = time.perf_counter()
        out = regenerate(examples, target, args.max_new_tokens, batch_size=size,
                         keep_empty=True, continuous=continuous)
        seconds = time.perf_counter() - started
        texts = answers(out)
        tokens = sum(len(target.tokenizer(t, add_special_tokens=False)["input_ids"])
                     for t in texts)
        if first is None:
            first = (seconds, texts)
        same = sum(a == b for a, b in zip(texts, first[1], strict=True))
        print(f"| {name} | {size} | {len(texts)} | {tokens} | {seconds:.1f} | "
              f"{tokens / seconds:.1f} | {first[0] / seconds:.2f}x | {same}/{len(texts)} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
