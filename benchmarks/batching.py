"""Output tokens/s at concurrency 1, 2, 4, 8: one request at a time vs continuous batching.

    python benchmarks/batching.py --target DIR [--head DIR | --random-head eagle3] \
        [--max-new-tokens 48] [--concurrency 1 2 4 8] [--k 4]

For each row (plain decoding; chain drafting when a head is given) and each concurrency c,
the same c requests (the prompts, cycled) run through the engine directly: "serial" =
``SpeculativeEngine.generate`` one request after another (what the server did before
batching), "batched" = ``BatchEngine`` with all c submitted together (one target forward per
step for all of them), and "per-row drafting" = the same batch with each request drafting
on its own (``batched_drafting=False``, what the engine did before batch_draft.py).
Throughput = all output tokens / wall time. Greedy: "differ" counts
batched outputs that are not identical to the serial ones (must be 0 in float32).
``--random-head`` builds an untrained head (acceptance ~0): it measures the chain machinery
(per-request drafting + batched K+1-token verification), not speculation gains. Not run in
tests.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from benchmarks.decode import held_out_prompts
from eaglenest.models.decode.batch import BatchEngine
from eaglenest.models.decode.engine import SpeculativeEngine
from eaglenest.models.decode.modes import DecodeMode
from eaglenest.models.heads.registry import EAGLE, EAGLE3


def random_head(target: Any, kind: str) -> torch.nn.Module:
    from eaglenest.models.data import builtin_path, encode_examples, load_examples
    from eaglenest.models.heads.registry import HEADS
    from eaglenest.models.training.config import TrainConfig

    examples = load_examples(builtin_path("gsm8k_training.jsonl"))[:16]
    samples = encode_examples(examples, target.tokenizer, max_length=256)
    torch.manual_seed(0)
    cfg = TrainConfig(head=kind, draft_vocab_size=8192)
    return HEADS[kind].build(target, samples, cfg).eval()


def measure(
    target: Any, head: Any, mode: str, prompts: list[list[int]], c: int, args: argparse.Namespace
) -> tuple[float, float, float | None, int]:
    """(serial tok/s, batched tok/s, batched tok/s with per-row drafting, outputs that differ
    from serial) for c concurrent requests."""
    jobs = [prompts[i % len(prompts)] for i in range(c)]
    stop = [args.eos] if args.eos is not None else []
    serial = SpeculativeEngine(target, head, mode, k=args.k)
    t0 = time.perf_counter()
    one_by_one = [serial.generate_ids(p, args.max_new_tokens, stop_token_ids=stop) for p in jobs]
    t_serial = time.perf_counter() - t0
    rates, differ = [], 0
    for batched_drafting in (True, False) if head is not None else (True,):
        batched = BatchEngine(target, head, mode, k=args.k, max_num_seqs=max(c, 1),
                              batched_drafting=batched_drafting)
        t0 = time.perf_counter()
        together = batched.generate_batch(jobs, args.max_new_tokens, stop_token_ids=stop)
        rates.append(sum(len(o) for o in together) / (time.perf_counter() - t0))
        differ += sum(a != b for a, b in zip(one_by_one, together, strict=True))
    tokens = sum(len(o) for o in one_by_one)
    return tokens / t_serial, rates[0], (rates[1] if len(rates) > 1 else None), differ


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--head", default=None)
    ap.add_argument("--random-head", default=None, choices=[EAGLE.kind, EAGLE3.kind])
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from eaglenest.models.checkpoint import load_head
    from eaglenest.models.target import load_target

    target = load_target(args.target)
    head = None
    if args.head:
        head = load_head(args.head, target.embed_weight(), target.lm_head_weight())
    elif args.random_head:
        head = random_head(target, args.random_head)
    tok = target.tokenizer
    args.eos = tok.eos_token_id
    sets = held_out_prompts(target, 2)  # already templated: the held-out first user turns
    prompts = [list(tok(p, add_special_tokens=False)["input_ids"])
               for p in sets["chat"] + sets["code"]]
    rows = [("plain", None, DecodeMode.PLAIN)] + (
        [(f"chain k={args.k}", head, DecodeMode.CHAIN)] if head else [])
    print(f"threads={torch.get_num_threads()} max_new_tokens={args.max_new_tokens} fp32")
    print(f"{'row':12} {'conc':>4} {'serial tok/s':>13} {'batched tok/s':>14} {'x':>6} "
          f"{'per-row drafting tok/s':>23} {'differ':>6}")
    for name, h, mode in rows:
        measure(target, h, mode, prompts, 2, argparse.Namespace(**{**vars(args),
                "max_new_tokens": 4}))  # warm-up
        for c in args.concurrency:
            serial, batched, per_row, differ = measure(target, h, mode, prompts, c, args)
            print(f"{name:12} {c:4d} {serial:13.2f} {batched:14.2f} {batched / serial:6.2f} "
                  f"{'-' if per_row is None else f'{per_row:.2f}':>23} {differ:6d}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
