"""Decoding speed and acceptance: HF generate, prompt lookup, vLLM and our engine's modes.

    python -m benchmarks.decode --target DIR --head DIR [--more-head DIR ...] \
        [--max-new-tokens 128] [--ks 3,5] [--concurrency 4,8] [--no-vllm] [--json PATH]
        [--dtype float32|bfloat16] [--more-trees 6:24]

Prompts: the held-out examples of the built-in datasets (the same split as
benchmarks/train_heads.py: never trained on), as two sets, ``chat`` (gsm8k, ultrachat) and
``code`` (magicoder, opencodeinstruct, swebench), chat-templated. Every row runs the same
prompts at batch 1, temperature 0, in this one process, interleaved (prompt by prompt, every
row in turn, so that drift in machine speed hits all rows alike):

* ``hf generate``: transformers' ``generate`` (greedy, KV cache) - the baseline (1.00x);
* ``hf prompt lookup``: transformers' prompt-lookup decoding (``prompt_lookup_num_tokens``);
* ``ours plain``, ``ours chain K``, ``ours tree`` (``--depth/--topk/--total-tokens``, plus
  one row per ``--more-trees`` DEPTH:TOTAL), ``ours chain adaptive`` and ``ours tree
  adaptive``, per ``--more-head`` (P-EAGLE, DFlash) ``ours MODE K`` and ``ours MODE adaptive``
  in its kind's mode (parallel, block): models.decode.SpeculativeEngine;
* ``ours chain K=<k> oracle`` per K of ``--ks``: chain K whose drafts are read from the same
  prompt's ``ours plain`` output (benchmarks/oracle.py; that output is decoded again,
  untimed, before the prompt's rows), so every draft is accepted: tau = K + 1 but for a
  prompt's last round, whose drafts past the known output need not be. It costs what
  verifying K + 1 tokens a round costs, no head work: the engine's ceiling for chain K on
  this box, in this run;
* ``vllm``, ``vllm eagle3 K`` and per ``--more-head`` ``vllm KIND K``: vLLM's OpenAI server
  (when installed), one prompt at a time over HTTP (so slightly pessimistic); each head with
  the method its config.json names (P-EAGLE ``eagle3`` + ``parallel_drafting``, DFlash ``dflash``).

Greedy decoding is lossless, so each row reports how many outputs differ from hf generate
(0 expected in fp32; vLLM compares its own target-only row). ``--dtype bfloat16`` runs every
row in bf16 (the baseline too): there a batched verification forward can round differently
from a one-token step and flip a near-tie, so a few outputs may differ; the column shows how
many (and the oracle rows, drafting plain's bf16 output, may fall short of tau = K + 1).
The header names each engine row's linear kernels (models/decode/kernels.py; forced by
``EAGLENEST_LINEAR_KERNEL``). After the rows' table, per prompt set, ``best / oracle``: the
fastest ``ours`` row that is not an oracle row (tokens/s) over the fastest oracle row (the
best measured K with perfect drafts, not necessarily the best row's K), both named: the
share of this box's ceiling our best mode reaches, comparable across machines (also under
"ceiling" in ``--json``). Then ``--concurrency`` levels through the OpenAI servers
(embedded with and without the head, vLLM with and without), output tokens/s.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.head_bench import first_user_prompt, split_builtin
from benchmarks.oracle import OracleSource
from eaglenest.foundation.host.processes import free_port
from eaglenest.models.decode.engine import SpeculativeEngine
from eaglenest.models.decode.kernel_cache import cpu_model
from eaglenest.models.decode.kernels import AUTO, KernelPolicy
from eaglenest.models.decode.modes import DecodeMode
from eaglenest.models.decode.stats import SpecStats
from eaglenest.models.heads.registry import head_spec, spec_of_config
from eaglenest.models.target import Target
from eaglenest.workers.jobs.loadgen import BenchConfig, run
from eaglenest.workers.model_servers.process import (
    EMBEDDED,
    VLLM,
    ServerProcess,
    ServerSpec,
    vllm_installed,
)

CODE_SETS = ("magicoder", "opencodeinstruct", "swebench")
ORACLE = " oracle"  # name suffix of the oracle rows (drafts read from plain's output)


@dataclass
class Row:
    name: str
    prompt_set: str
    tokens_per_second: float
    tau: float | None
    differ: int
    speedup: float = 1.0
    outputs: list[list[int]] = field(default_factory=list, repr=False)


def held_out_prompts(target: Target, held_out: int) -> dict[str, list[str]]:
    """{"chat": [...], "code": [...]}: templated first user turns of the held-out examples."""
    from eaglenest.models.data import BUILTIN_NAMES, load_examples

    sets: dict[str, list[str]] = {"chat": [], "code": []}
    _, eval_ex = split_builtin(held_out)
    names = [n for n in BUILTIN_NAMES for _ in load_examples(n)[-held_out:]]
    for name, ex in zip(names, eval_ex, strict=True):
        kind = "code" if name.startswith(CODE_SETS) else "chat"
        sets[kind].append(first_user_prompt(ex, target))
    return sets


def _truncate(ids: list[int], stop: int | None) -> list[int]:
    return ids[: ids.index(stop) + 1] if stop is not None and stop in ids else ids


Fn = Callable[[list[int]], tuple[list[int], SpecStats | None]]


def time_rows(fns: dict[str, Fn], prompts: list[list[int]],
              prepare: Callable[[list[int]], object] | None = None,
              ) -> dict[str, tuple[float, float | None, list[list[int]]]]:
    """Every row on every prompt, interleaved: prompt by prompt, each row in turn (the order
    reversed every other prompt), so that a drift in machine speed (a shared host's varies
    over minutes) hits all rows alike; ``prepare(prompt)`` runs first, untimed. Per row:
    (output tokens/s over all prompts, acceptance length or None, outputs)."""
    elapsed = dict.fromkeys(fns, 0.0)
    outs: dict[str, list[list[int]]] = {name: [] for name in fns}
    stats = {name: SpecStats() for name in fns}
    speculative: set[str] = set()
    names = list(fns)
    for i, ids in enumerate(prompts):
        if prepare is not None:
            prepare(ids)
        for name in names if i % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            out, st = fns[name](ids)
            elapsed[name] += time.perf_counter() - t0
            outs[name].append(out)
            if st is not None:
                speculative.add(name)
                stats[name].merge(st)
    return {name: (sum(len(o) for o in outs[name]) / max(elapsed[name], 1e-9),
                   stats[name].acceptance_length if name in speculative else None, outs[name])
            for name in names}


def hf_rows(target: Target, n: int, eos: int | None) -> dict[str, Callable]:
    model = target.model

    def hf(extra: dict[str, Any]) -> Callable[[list[int]], tuple[list[int], None]]:
        def go(ids: list[int]) -> tuple[list[int], None]:
            x = torch.tensor([ids])
            with torch.no_grad():
                out = model.generate(  # type: ignore[operator]
                    x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                                     do_sample=False, pad_token_id=eos, **extra)
            return _truncate(out[0, len(ids):].tolist(), eos), None
        return go

    return {"hf generate": hf({}), "hf prompt lookup": hf({"prompt_lookup_num_tokens": 10})}


def engine_rows(target: Target, head: Any, more: list[Any], args: argparse.Namespace,
                oracle: OracleSource) -> dict[str, SpeculativeEngine]:
    tree = dict(depth=args.depth, topk=args.topk, total_tokens=args.total_tokens)
    model = target.model
    kernels = KernelPolicy(force=os.environ.get("EAGLENEST_LINEAR_KERNEL", AUTO))
    make = functools.partial(SpeculativeEngine, kernels=kernels)
    rows = {"ours plain": make(model, None)}
    for k in args.ks:
        rows[f"ours chain K={k}"] = make(model, head, DecodeMode.CHAIN, k=k)
        rows[f"ours chain K={k}{ORACLE}"] = make(model, None, DecodeMode.CHAIN, k=k,
                                                 drafter_factory=oracle.drafter)
    rows[f"ours tree d={args.depth} top{args.topk} n={args.total_tokens}"] = make(
        model, head, DecodeMode.TREE, **tree)
    for d, n in args.more_trees:  # larger trees: more acceptance for a larger verification
        rows[f"ours tree d={d} top{args.topk} n={n}"] = make(
            model, head, DecodeMode.TREE, depth=d, topk=args.topk, total_tokens=n)
    rows["ours chain adaptive"] = make(model, head, DecodeMode.CHAIN, k=max(args.ks),
                                       adaptive=True)
    rows["ours tree adaptive"] = make(model, head, DecodeMode.TREE, adaptive=True, **tree)
    for extra in more:  # each in its kind's own mode (P-EAGLE parallel, DFlash block)
        mode = head_spec(extra).default_mode
        for k in args.ks:
            rows[f"ours {mode} K={k}"] = make(model, extra, mode, k=k)
        rows[f"ours {mode} adaptive"] = make(model, extra, mode, k=max(args.ks), adaptive=True)
    print(f"# linear kernels ({cpu_model()}, {torch.get_num_threads()} threads; "
          f"EAGLENEST_LINEAR_KERNEL={kernels.force}):")
    for name, engine in rows.items():
        print(f"#   {name}: {engine.kernels.summary()}")
    return rows


def engine_fn(engine: SpeculativeEngine, n: int, eos: int | None) -> Callable:
    stop = [eos] if eos is not None else []

    def go(ids: list[int]) -> tuple[list[int], SpecStats | None]:
        out = engine.generate_ids(ids, n, stop_token_ids=stop)
        return out, (engine.request_stats if engine.mode.spec.drafts else None)
    return go


def serve(args: argparse.Namespace, backend: str, log: Path, head: Path | None = None,
          k: int = 3) -> ServerProcess:
    spec = ServerSpec(model_dir=Path(args.target), served_name="smol", port=free_port(),
                      backend=backend, head_dir=head, num_speculative_tokens=k,
                      dtype=args.dtype, max_model_len=2048)
    server = ServerProcess(spec, log)
    server.start(900.0)
    return server


def served_level(server: ServerProcess, prompts: list[str], n: int, c: int) -> Any:
    cfg = BenchConfig(base_url=server.base_url, model="smol", prompts=prompts,
                      concurrencies=(c,), max_tokens=n, requests_per_level=max(len(prompts), c))
    (level,) = asyncio.run(run(cfg))
    return level


def server_configs(args: argparse.Namespace) -> list[tuple[str, str, Path | None, int]]:
    k = max(args.ks)
    configs = [("embedded plain", EMBEDDED, None, k),
               (f"embedded chain K={k}", EMBEDDED, Path(args.head), k)]
    if not args.no_vllm and vllm_installed():
        vllm = [("vllm", VLLM, None, k), (f"vllm eagle3 K={k}", VLLM, Path(args.head), k)]
        for folder in args.more_head:  # served as the head's config.json says
            kind = spec_of_config(json.loads((Path(folder) / "config.json").read_text())).kind
            vllm.append((f"vllm {kind} K={k}", VLLM, Path(folder), k))
        configs = [*vllm, *configs]
    return configs


def ceilings(rows: list[Row]) -> list[dict[str, Any]]:
    """Per prompt set: our fastest non-oracle row over the fastest oracle row (the ceiling:
    the best measured K with perfect drafts), tokens/s of each and ``best_over_oracle``."""
    out = []
    for set_name in dict.fromkeys(r.prompt_set for r in rows):
        ours = [r for r in rows if r.prompt_set == set_name and r.name.startswith("ours ")]
        best = max((r for r in ours if not r.name.endswith(ORACLE)),
                   key=lambda r: r.tokens_per_second)
        top = max((r for r in ours if r.name.endswith(ORACLE)), key=lambda r: r.tokens_per_second)
        out.append({"prompt_set": set_name, "best": best.name,
                    "best_tps": best.tokens_per_second, "oracle": top.name,
                    "oracle_tps": top.tokens_per_second,
                    "best_over_oracle": best.tokens_per_second / top.tokens_per_second})
    return out


def markdown(rows: list[Row], levels: list[dict[str, Any]]) -> str:
    lines = ["| prompts | row | tok/s | vs hf generate | tau | outputs differing |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        tau = f"{r.tau:.2f}" if r.tau else "-"
        lines.append(f"| {r.prompt_set} | {r.name} | {r.tokens_per_second:.1f} | "
                     f"{r.speedup:.2f}x | {tau} | {r.differ} |")
    lines += ["", "| prompts | best row | tok/s | oracle row | tok/s | best / oracle |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {c['prompt_set']} | {c['best']} | {c['best_tps']:.1f} | {c['oracle']} | "
              f"{c['oracle_tps']:.1f} | {c['best_over_oracle']:.1%} |" for c in ceilings(rows)]
    if levels:
        lines += ["", "| server | concurrency | output tok/s | TTFT p50 ms | tau |",
                  "|---|---|---|---|---|"]
        for lv in levels:
            tau = f"{lv['tau']:.2f}" if lv["tau"] else "-"
            lines.append(f"| {lv['server']} | {lv['concurrency']} | {lv['output_tps']:.1f} | "
                         f"{lv['ttft_ms']:.0f} | {tau} |")
    return "\n".join(lines)


def vllm_batch1(server: ServerProcess, prompts: list[str], n: int,
                ) -> tuple[float, float | None, list[str]]:
    """(tokens/s, tau, texts) of the prompts one at a time, non-streaming, temperature 0."""
    import httpx

    from eaglenest.workers.model_servers.embedded.metrics import parse_spec_counters

    with httpx.Client(timeout=3600) as client:
        before = parse_spec_counters(client.get(f"{server.base_url}/metrics").text)
        texts, tokens, elapsed = [], 0, 0.0
        for p in prompts:
            body = {"model": "smol", "prompt": p, "max_tokens": n, "temperature": 0.0}
            t0 = time.perf_counter()
            r = client.post(f"{server.base_url}/v1/completions", json=body).json()
            elapsed += time.perf_counter() - t0
            texts.append(r["choices"][0]["text"])
            tokens += int(r["usage"]["completion_tokens"])
        after = parse_spec_counters(client.get(f"{server.base_url}/metrics").text)
    drafts = after.get("drafts", 0.0) - before.get("drafts", 0.0)
    accepted = after.get("accepted", 0.0) - before.get("accepted", 0.0)
    return tokens / max(elapsed, 1e-9), (1 + accepted / drafts) if drafts else None, texts


def in_process(target: Target, head: Any, more: list[Any], sets: dict[str, list[list[int]]],
               args: argparse.Namespace) -> list[Row]:
    eos = target.tokenizer.eos_token_id
    n = args.max_new_tokens
    oracle = OracleSource(end=eos if eos is not None else 0)
    fns: dict[str, Callable] = hf_rows(target, n, eos)
    fns.update({name: engine_fn(e, n, eos)
                for name, e in engine_rows(target, head, more, args, oracle).items()})
    plain = fns["ours plain"]

    def prepare(ids: list[int]) -> None:  # the oracle rows' drafts: plain's output, untimed
        oracle.load(ids + plain(ids)[0])

    time_rows(fns, next(iter(sets.values()))[:1], prepare)  # warm-up (oneDNN, caches)
    rows: list[Row] = []
    for set_name, prompts in sets.items():
        base: Row | None = None
        for name, (rate, tau, outs) in time_rows(fns, prompts, prepare).items():
            ref = base.outputs if base else outs
            row = Row(name, set_name, rate, tau, sum(a != b for a, b in zip(outs, ref,
                                                                            strict=True)),
                      rate / base.tokens_per_second if base else 1.0, outs)
            base = base or row
            rows.append(row)
            print(f"{set_name:5} {name:34} {rate:7.2f} tok/s {row.speedup:5.2f}x "
                  f"tau {tau or 0:.2f} differ {row.differ}", flush=True)
    return rows


def served(args: argparse.Namespace, sets: dict[str, list[str]],
           base_rates: dict[str, float]) -> tuple[list[Row], list[dict[str, Any]]]:
    rows, levels = [], []
    everything = [p for ps in sets.values() for p in ps]
    reference: dict[str, list[str]] = {}
    for name, backend, head, k in server_configs(args):
        server = serve(args, backend, args.out / f"{name.replace(' ', '_')}.log", head, k)
        try:
            if backend == VLLM:
                for set_name, prompts in sets.items():
                    rate, tau, texts = vllm_batch1(server, prompts, args.max_new_tokens)
                    ref = reference.setdefault(set_name, texts)
                    rows.append(Row(name, set_name, rate, tau,
                                    sum(a != b for a, b in zip(texts, ref, strict=True)),
                                    rate / base_rates[set_name]))
                    print(f"{set_name:5} {name:34} {rate:7.2f} tok/s tau {tau or 0:.2f}",
                          flush=True)
            for c in args.concurrency:
                lv = served_level(server, everything, args.max_new_tokens, c)
                levels.append({"server": name, "concurrency": c,
                               "output_tps": lv.output_throughput,
                               "ttft_ms": lv.ttft_ms_p50, "tau": lv.acceptance_length})
                print(f"      {name:34} c={c} {lv.output_throughput:7.2f} tok/s", flush=True)
        finally:
            server.stop()
    return rows, levels


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None, help="default: the prepared SmolLM2 target")
    ap.add_argument("--head", required=True, help="an EAGLE-3 (or EAGLE) head folder")
    ap.add_argument("--more-head", action="append", default=[],
                    help="a P-EAGLE or DFlash head: rows in its kind's mode (repeatable)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--ks", default="3,5")
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--total-tokens", type=int, default=16)
    ap.add_argument("--more-trees", default="6:24", help="extra fixed tree rows, DEPTH:TOTAL,...")
    ap.add_argument("--held-out", type=int, default=2)
    ap.add_argument("--concurrency", default="4,8")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="every row's weights and activations, HF rows and servers included")
    ap.add_argument("--out", type=Path, default=Path("/tmp/eaglenest-decode"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    args.ks = [int(k) for k in args.ks.split(",")]
    args.more_trees = [tuple(int(v) for v in t.split(":")) for t in args.more_trees.split(",") if t]
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    return args


def main(argv: list[str] | None = None) -> int:
    from eaglenest.models.checkpoint import load_head
    from eaglenest.models.prepare import cached_smollm2
    from eaglenest.models.target import load_target

    args = parse_args(argv)
    args.target = args.target or str(cached_smollm2())
    args.out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    target = load_target(args.target, dtype=dtype)
    emb, lm = target.embed_weight(), target.lm_head_weight()
    head = load_head(args.head, emb, lm).to(dtype).eval()
    extra = [load_head(folder, emb, lm).to(dtype).eval() for folder in args.more_head]
    texts = held_out_prompts(target, args.held_out)
    tok = target.tokenizer
    ids = {k: [list(tok(p, add_special_tokens=False)["input_ids"]) for p in v]
           for k, v in texts.items()}
    rows = in_process(target, head, extra, ids, args)
    base = {r.prompt_set: r.tokens_per_second for r in rows if r.name == "hf generate"}
    more, levels = served(args, texts, base)
    rows += more
    print(markdown(rows, levels))
    if args.json:
        args.json.write_text(json.dumps({"rows": [{k: v for k, v in asdict(r).items()
                                                   if k != "outputs"} for r in rows],
                                         "ceiling": ceilings(rows),
                                         "levels": levels}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
