"""`eaglenest bench --target DIR --head DIR`: the optimization job's benchmark stage alone.

Baseline (target alone) and EAGLE (target + head, at each K of --ks) served by the same
backend, the same load at each concurrency; writes benchmark.json / .md / .png into --out,
speculation_schedule.json into --out, and prints the table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eaglenest.cli.datadir import add_data_dir_option, settings_for
from eaglenest.models.decode.modes import SPECULATIVE_MODES, DecodeMode


def _prompts(args: argparse.Namespace) -> list[str]:
    if args.prompts:
        lines = Path(args.prompts).read_text().splitlines()
        return [json.loads(x)["prompt"] if x.startswith("{") else x for x in lines if x.strip()]
    from eaglenest.models.data import BUILTIN_NAMES, Chat, builtin_path, load_examples

    prompts: list[str] = []
    for name in BUILTIN_NAMES:  # the last example of each built-in file (held out by jobs)
        example = load_examples(builtin_path(name))[-1]
        if isinstance(example, Chat):
            prompts.append(next(m["content"] for m in example.messages if m["role"] == "user"))
        else:
            prompts.append(example.prompt)
    return prompts


def _rounds(raw: str) -> int:
    """--rounds: an integer from 1 to 10 (as EAGLENEST_BENCH_ROUNDS)."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an integer") from None
    if not 1 <= value <= 10:
        raise argparse.ArgumentTypeError(f"{value} must be between 1 and 10")
    return value


def _kernel_cache(args: argparse.Namespace) -> Path | None:
    """--kernel-cache: a folder, `none` (every embedded server measures its kernels), or
    by default the data dir's, which jobs' and endpoints' servers use."""
    if args.kernel_cache == "none":
        return None
    if args.kernel_cache:
        return Path(args.kernel_cache)
    return settings_for(args).kernels_dir


def cmd_bench(args: argparse.Namespace) -> int:
    from eaglenest.workers.jobs.bench_stage import BenchPlan, run_benchmark
    from eaglenest.workers.model_servers.process import default_backend

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    levels = tuple(int(c) for c in args.concurrency.split(","))
    plan = BenchPlan(Path(args.target), Path(args.head), _prompts(args),
                     args.backend or default_backend(), levels, args.max_tokens,
                     args.num_speculative_tokens, mode=args.mode,
                     ks=tuple(int(k) for k in args.ks.split(",")) if args.ks else (),
                     rounds=args.rounds, kernel_cache=_kernel_cache(args))
    report = run_benchmark(plan, out, should_stop=lambda: False)
    print((out / "benchmark.md").read_text())
    print("speedup (EAGLE / baseline output throughput):",
          ", ".join(f"c={c}: {s:.2f}x" for c, s in report["speedup"].items()))
    print("speculation schedule:", json.dumps(report["schedule"]["thresholds"]))
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("bench", help="benchmark baseline vs EAGLE on a target and a head",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="target model folder")
    p.add_argument("--head", required=True, help="draft head folder")
    p.add_argument("--out", default="bench-out",
                   help="folder for benchmark.json / .md / .png")
    p.add_argument("--prompts", default=None, help="text file, one prompt per line (or JSONL "
                   "with a prompt field) (default: the last example of each built-in dataset)")
    p.add_argument("--concurrency", default="1,2,4,8",
                   help="concurrent requests, comma-separated levels")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request")
    p.add_argument("--num-speculative-tokens", type=int, default=5,
                   help="K: drafted tokens per step")
    p.add_argument("--ks", default="", help="K values to measure, e.g. 1,3,5 (default: "
                   "--num-speculative-tokens); the schedule picks among them")
    p.add_argument("--rounds", type=_rounds, default=2, help="rounds each row is measured in "
                   "at each level, 1-10 (the level's requests split over them); a K is "
                   "scheduled only if it beats the baseline in every one")
    p.add_argument("--mode", default=DecodeMode.CHAIN.value, choices=SPECULATIVE_MODES,
                   help="drafting (embedded backend): chain, EAGLE-2 tree or P-EAGLE parallel")
    p.add_argument("--backend", default=None, choices=["vllm", "embedded"],
                   help="model server (default: vllm if installed, else embedded)")
    p.add_argument("--kernel-cache", default=None, metavar="DIR",
                   help="embedded servers' linear-kernel timing cache (default: <data dir>/"
                        "kernels, the jobs' and endpoints'; none: each server measures)")
    add_data_dir_option(p)
    p.set_defaults(func=cmd_bench)
