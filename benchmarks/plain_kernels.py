"""Batch-1 decoding of plain, chain K=1 and chain+adaptive K=5 in one process, with the
linear kernels one policy chooses for all three: whether a benchmark's baseline and its
speculative rows would run alike (docs/benchmarks.md, "README walkthrough").

    EAGLENEST_LINEAR_KERNEL=stock|onednn|auto python -m benchmarks.plain_kernels --head DIR
        [--target DIR] [--max-new-tokens 64] [--rounds 2]

Prompts: the 8 held-out examples of the built-in datasets (the job's split), chat-templated;
every row decodes every prompt in turn, the row order reversed each round; greedy, fp32.
Prints each row's kernels, tokens, seconds, tok/s and its ratio to plain.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from eaglenest.models.checkpoint import load_head
from eaglenest.models.data import BUILTIN_NAMES, builtin_path, load_examples
from eaglenest.models.data.split import held_out_split
from eaglenest.models.decode import SpeculativeEngine
from eaglenest.models.decode.kernels import AUTO, KernelPolicy
from eaglenest.models.decode.modes import DecodeMode
from eaglenest.models.target import load_target
from eaglenest.workers.jobs.job_data import prompt_text

DEFAULT_TARGET = Path.home() / ".cache" / "eaglenest" / "smollm2-135m-instruct"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--head", type=Path, required=True)
    p.add_argument("--target", type=Path, default=DEFAULT_TARGET)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    target = load_target(args.target, device="cpu")
    head = load_head(args.head, target.embed_weight(), target.lm_head_weight()).eval()
    examples = [e for n in BUILTIN_NAMES for e in load_examples(builtin_path(n))]
    _, held, _ = held_out_split(examples, 8)
    tok = target.tokenizer
    prompts = [tok(prompt_text(e, tok), add_special_tokens=False)["input_ids"] for e in held]
    policy = KernelPolicy(force=os.environ.get("EAGLENEST_LINEAR_KERNEL", AUTO))
    rows = {"plain": SpeculativeEngine(target.model, None, kernels=policy),
            "chain K=1": SpeculativeEngine(target.model, head, DecodeMode.CHAIN, k=1,
                                           kernels=policy),
            "chain+adaptive K=5": SpeculativeEngine(target.model, head, DecodeMode.CHAIN, k=5,
                                                    adaptive=True, kernels=policy)}
    stop = [tok.eos_token_id] if tok.eos_token_id is not None else []
    for name, engine in rows.items():
        print(f"# {name}: {engine.kernels.summary()}")
        engine.generate_ids(prompts[0], 8, stop_token_ids=stop)  # untimed warm-up
    done = {name: [0, 0.0] for name in rows}
    for r in range(args.rounds):
        order = list(rows) if r % 2 == 0 else list(reversed(rows))
        for ids in prompts:
            for name in order:
                start = time.perf_counter()
                out = rows[name].generate_ids(ids, args.max_new_tokens, stop_token_ids=stop)
                done[name][1] += time.perf_counter() - start
                done[name][0] += len(out)
    print(f"EAGLENEST_LINEAR_KERNEL={policy.force}, torch threads {torch.get_num_threads()}")
    plain = done["plain"][0] / done["plain"][1]
    for name, (tokens, seconds) in done.items():
        rate = tokens / seconds
        print(f"{name:<20} {tokens:6d} tok {seconds:7.1f} s {rate:6.1f} tok/s  "
              f"{rate / plain:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
