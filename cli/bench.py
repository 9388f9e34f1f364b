"""`eaglenest bench --target DIR --head DIR`: the optimization job's benchmark stage alone.

Baseline (target alone) and a row per decoding and K (target + head: the first of
--decodings at each K of --ks, the others at the largest) served by the same backend, the same
load at each concurrency, in rounds sized as a job's (at least --rounds; more while the
leading row's, the baseline's or the fastest row's rounds spread 5% or more, up to
--max-rounds, within --minutes); writes
benchmark.json / .md / .png into --out, speculation_schedule.json into --out, and prints the
table.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from eaglenest.cli.datadir import add_data_dir_option, settings_for


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


def _between(lo: int, hi: int) -> Callable[[str], int]:
    """--rounds (1-10, as EAGLENEST_BENCH_ROUNDS), --max-rounds (1-20, as
    EAGLENEST_BENCH_MAX_ROUNDS): an integer in [lo, hi]."""
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} must be between {lo} and {hi}")
        return value

    return parse


def _decodings(args: argparse.Namespace, backend: str) -> tuple[str, tuple[str, ...]]:
    """(the head kind's default mode, the decodings to measure): --decodings checked as
    EAGLENEST_BENCH_DECODINGS is (workers/jobs/options.py ``decodings_for``), else the head
    kind's on this backend, as a job's; the kind from the head's config.json."""
    from eaglenest.models.heads.registry import spec_of_config
    from eaglenest.workers.jobs.options import decodings_for

    try:
        spec = spec_of_config(json.loads((Path(args.head) / "config.json").read_text()))
        asked = tuple(d.strip() for d in args.decodings.split(",") if d.strip()) or None
        return str(spec.default_mode), decodings_for(spec, backend, asked)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"eaglenest bench: --decodings / --head: {exc}") from None


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

    backend = args.backend or default_backend()
    mode, decodings = _decodings(args, backend)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    levels = tuple(int(c) for c in args.concurrency.split(","))
    plan = BenchPlan(Path(args.target), Path(args.head), _prompts(args), backend, levels,
                     args.max_tokens, args.num_speculative_tokens, mode=mode,
                     ks=tuple(int(k) for k in args.ks.split(",")) if args.ks else (),
                     rounds=args.rounds, max_rounds=args.max_rounds, minutes=args.minutes,
                     decodings=decodings, kernel_cache=_kernel_cache(args))
    report = run_benchmark(plan, out, should_stop=lambda: False)
    print((out / "benchmark.md").read_text())
    first = plan.rows[0].decoding
    print(f"speedup ({first} at K={plan.num_speculative_tokens} / baseline output "
          "throughput):", ", ".join(f"c={c}: {s:.2f}x" for c, s in report["speedup"].items()))
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
    p.add_argument("--rounds", type=_between(1, 10), default=2, help="rounds each row is "
                   "measured in at each level at least, 1-10 (each sends every prompt once); "
                   "a row is scheduled only if it beats the baseline in every one")
    p.add_argument("--max-rounds", type=_between(1, 20), default=6, help="the most rounds at "
                   "a level: more than --rounds while the leading, baseline or fastest "
                   "row's rounds spread 5%% or more")
    p.add_argument("--minutes", type=float, default=0.0, help="the budget for rounds beyond "
                   "--rounds, from the start (default 0: none)")
    p.add_argument("--decodings", default="", help="decodings to measure, e.g. chain,tree,"
                   "chain+adaptive: the first at every K, the others at the largest (default: "
                   "the head kind's, as a job's; vLLM: its own only)")
    p.add_argument("--backend", default=None, choices=["vllm", "embedded"],
                   help="model server (default: vllm if installed, else embedded)")
    p.add_argument("--kernel-cache", default=None, metavar="DIR",
                   help="embedded servers' linear-kernel timing cache (default: <data dir>/"
                        "kernels, the jobs' and endpoints'; none: each server measures)")
    add_data_dir_option(p)
    p.set_defaults(func=cmd_bench)
