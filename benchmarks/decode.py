"""Tokens/s and acceptance length: plain decoding vs chain / tree / parallel / adaptive.

    python benchmarks/decode.py --target DIR [--head DIR] [--prompts FILE.jsonl] \
        [--max-new-tokens 128] [--k 4] [--depth 5 --topk 4 --total-tokens 16]

Every row runs the same prompts at batch 1, temperature 0 (greedy, so every row must emit
the same text: the table also reports how many outputs differ from the plain baseline).
Not run in tests.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from models.decode.engine import SpeculativeEngine  # noqa: E402
from models.decode.stats import SpecStats  # noqa: E402

DEFAULT_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences why the sky is blue.",
    "def quicksort(items):\n",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips"
    " in May. How many clips did Natalia sell altogether in April and May?",
]


def load_prompts(path: str | None) -> list[str]:
    if not path:
        return DEFAULT_PROMPTS
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r.get("prompt") or r["messages"][0]["content"] for r in rows]


def run_row(
    engine: SpeculativeEngine, prompts: list[list[int]], n: int, stop: list[int]
) -> tuple[float, SpecStats, list[list[int]]]:
    stats, outs, elapsed = SpecStats(), [], 0.0
    for ids in prompts:
        t0 = time.perf_counter()
        outs.append(engine.generate_ids(ids, n, stop_token_ids=stop))
        elapsed += time.perf_counter() - t0
        stats.merge(engine.request_stats)
    return sum(len(o) for o in outs) / elapsed, stats, outs


def engines(target: Any, head: Any, args: argparse.Namespace) -> dict[str, SpeculativeEngine]:
    rows = {"plain": SpeculativeEngine(target, None)}
    if head is None:
        return rows
    tree = dict(depth=args.depth, topk=args.topk, total_tokens=args.total_tokens)
    rows[f"chain k={args.k}"] = SpeculativeEngine(target, head, "chain", k=args.k)
    rows["chain adaptive"] = SpeculativeEngine(target, head, "chain", k=args.k, adaptive=True)
    rows[f"tree d={args.depth} k={args.topk} n={args.total_tokens}"] = SpeculativeEngine(
        target, head, "tree", **tree
    )
    rows["tree adaptive"] = SpeculativeEngine(target, head, "tree", adaptive=True, **tree)
    from models.heads.peagle import PEagleHead

    if isinstance(head, PEagleHead):
        rows[f"parallel k={args.k}"] = SpeculativeEngine(target, head, "parallel", k=args.k)
        rows["parallel adaptive"] = SpeculativeEngine(
            target, head, "parallel", k=args.k, adaptive=True
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--head", default=None)
    ap.add_argument("--prompts", default=None, help="JSONL with prompt or messages")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--total-tokens", type=int, default=16)
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from models.checkpoint import load_head
    from models.decode.cli import encode_prompt
    from models.target import load_target

    dtype = getattr(torch, args.dtype)
    target = load_target(args.target, dtype=dtype)
    head = None
    if args.head:
        head = load_head(args.head, target.embed_weight(), target.lm_head_weight()).to(dtype)
    tok = target.tokenizer
    prompts = [encode_prompt(tok, p, args.chat) for p in load_prompts(args.prompts)]
    stop = [tok.eos_token_id] if tok.eos_token_id is not None else []
    rows = engines(target, head, args)
    run_row(rows["plain"], prompts[:1], 8, stop)  # warm-up
    base_rate, _, base_out = run_row(rows["plain"], prompts, args.max_new_tokens, stop)
    print(f"{'row':34} {'tok/s':>8} {'speedup':>8} {'tau':>6} {'differ':>7}")
    print(f"{'plain':34} {base_rate:8.2f} {1.0:8.2f} {1.0:6.2f} {0:7d}")
    for name, engine in rows.items():
        if name == "plain":
            continue
        rate, stats, outs = run_row(engine, prompts, args.max_new_tokens, stop)
        differ = sum(a != b for a, b in zip(outs, base_out, strict=True))
        print(
            f"{name:34} {rate:8.2f} {rate / base_rate:8.2f} "
            f"{stats.acceptance_length:6.2f} {differ:7d}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
