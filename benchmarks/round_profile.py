"""Where a decoding round's time goes: matrix work vs everything else, per mode.

    python -m benchmarks.round_profile --head H [--peagle-head P] [--tokens 96] [--prompts 3]

For the prepared SmolLM2 target in float32 with the kernels the engine chooses on this host
(models/decode/kernels.py), each mode (``plain``, ``chain K=5``, ``tree d=5 top4 n=16`` and,
with ``--peagle-head``, ``parallel K=5``; plain and chain twice more: ``unfused``, without
fusing sibling projections (models/decode/fusion.py), and ``transformers forward``,
unfused on transformers' own forward instead of the engine's direct one,
models/decode/direct.py: the engine before both) decodes the same
held-out chat prompts twice: once timed (the modes interleaved prompt by prompt; ms per
round), once under torch's profiler, whose op times split a round into

* ``matrix``: the linears (stock ``aten::addmm``/``mm``, oneDNN ``mkldnn::_linear_pointwise``)
  and attention (``scaled_dot_product_attention`` and the kernels under it);
* ``other ops``: every other aten op (copies, cat, indexing, norms, activations, argmax,
  mask building), by self time, its largest five named;
* ``outside ops``: the round's wall time under the profiler minus all op self time: Python,
  dispatch and the profiler's own cost per op (so an upper bound of the Python share).

Shares are of the profiled wall time (the profiler slows a round down; the unprofiled ms per
round is the figure to compare between runs). The header names the CPU (``lscpu``'s model)
and the kernels chosen. What to look at: a large ``other ops`` or ``outside ops`` share is
work a round does besides its matrices, which item 2 of the engine's speed work removes.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile

from eaglenest.models.checkpoint import load_head
from eaglenest.models.decode.engine import SpeculativeEngine
from eaglenest.models.decode.kernel_cache import cpu_model
from eaglenest.models.decode.kernels import KernelPolicy
from eaglenest.models.decode.modes import DecodeMode
from eaglenest.models.prepare import cached_smollm2
from eaglenest.models.target import Target, load_target

MATRIX_OPS = ("addmm", "mm", "bmm", "baddbmm", "linear", "matmul", "scaled_dot_product",
              "flash_attention")


def is_matrix(name: str) -> bool:
    """aten::addmm, mkldnn::_linear_pointwise, aten::_scaled_dot_product_flash_attention_for_cpu
    ... -> True; aten::cat, aten::copy_ -> False (the op after ``::``, leading ``_`` removed,
    equals or starts with a MATRIX_OPS name)."""
    op = name.split("::")[-1].lstrip("_")
    return any(op == m or op.startswith(m) for m in MATRIX_OPS)


@dataclass
class Split:
    mode: str
    rounds: int = 0
    tokens: int = 0
    ms_per_round: float = 0.0  # unprofiled
    profiled_ms: float = 0.0  # wall under the profiler, per round
    matrix_ms: float = 0.0
    other_ms: float = 0.0
    ops_per_round: float = 0.0
    top_other: list[tuple[str, float]] = field(default_factory=list)

    @property
    def outside_ms(self) -> float:
        return max(self.profiled_ms - self.matrix_ms - self.other_ms, 0.0)


def decode(engine: SpeculativeEngine, prompts: list[list[int]], n: int) -> tuple[int, int]:
    """(rounds, tokens) over the prompts; a round = one target forward after the prefill."""
    rounds = tokens = 0
    for ids in prompts:
        out = engine.generate_ids(ids, n)
        rounds += engine.request_stats.num_target_forwards - 1
        tokens += len(out)
    return rounds, tokens


def timed(built: dict[str, SpeculativeEngine], prompts: list[list[int]], n: int
          ) -> dict[str, Split]:
    """Each engine's unprofiled ms per round, the engines interleaved prompt by prompt."""
    splits = {name: Split(name) for name in built}
    seconds = dict.fromkeys(built, 0.0)
    for engine in built.values():
        decode(engine, prompts[:1], 16)  # warm-up
    for ids in prompts:
        for name, engine in built.items():
            t0 = time.perf_counter()
            rounds, tokens = decode(engine, [ids], n)
            seconds[name] += time.perf_counter() - t0
            splits[name].rounds += rounds
            splits[name].tokens += tokens
    for name, split in splits.items():
        split.ms_per_round = 1e3 * seconds[name] / max(split.rounds, 1)
    return splits


def profiled(split: Split, engine: SpeculativeEngine, prompts: list[list[int]], n: int
             ) -> Split:
    """``split`` (timed) with the profiled shares filled in."""
    rounds = split.rounds
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        decode(engine, prompts, n)
        wall = time.perf_counter() - t0
    other: Counter[str] = Counter()
    calls = 0
    for ev in prof.key_averages():
        self_ms = ev.self_cpu_time_total / 1e3
        calls += ev.count
        if is_matrix(ev.key):
            split.matrix_ms += self_ms
        else:
            other[ev.key] += self_ms
    per = max(rounds, 1)
    split.profiled_ms = 1e3 * wall / per
    split.matrix_ms /= per
    split.other_ms = sum(other.values()) / per
    split.ops_per_round = calls / per
    split.top_other = [(k, v / per) for k, v in other.most_common(5)]
    return split


def engines(target: Target, args: argparse.Namespace) -> dict[str, SpeculativeEngine]:
    emb, lm = target.embed_weight(), target.lm_head_weight()
    head = load_head(args.head, emb, lm).eval()
    model = target.model
    unfused = KernelPolicy(fuse=False)
    out = {"plain": SpeculativeEngine(model, None),
           "plain, unfused": SpeculativeEngine(model, None, kernels=unfused),
           "plain, transformers forward": SpeculativeEngine(model, None, kernels=unfused,
                                                            direct=False),
           "chain K=5": SpeculativeEngine(model, head, DecodeMode.CHAIN, k=5),
           "chain K=5, unfused": SpeculativeEngine(model, head, DecodeMode.CHAIN, k=5,
                                                   kernels=unfused),
           "chain K=5, transformers forward": SpeculativeEngine(
               model, head, DecodeMode.CHAIN, k=5, kernels=unfused, direct=False),
           "tree d=5 top4 n=16": SpeculativeEngine(model, head, DecodeMode.TREE, depth=5,
                                                   topk=4, total_tokens=16)}
    if args.peagle_head:
        peagle = load_head(args.peagle_head, emb, lm).eval()
        out["parallel K=5"] = SpeculativeEngine(model, peagle, DecodeMode.PARALLEL, k=5)
    return out


def table(rows: list[Split]) -> str:
    lines = ["| mode | ms/round | tokens/round | profiled ms/round | matrix | other ops | "
             "outside ops | ops/round | largest other ops (ms/round) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = max(r.profiled_ms, 1e-9)
        top = ", ".join(f"{k.split('::')[-1]} {v:.2f}" for k, v in r.top_other)
        lines.append(
            f"| {r.mode} | {r.ms_per_round:.1f} | {r.tokens / max(r.rounds, 1):.2f} | "
            f"{r.profiled_ms:.1f} | {100 * r.matrix_ms / p:.0f}% | {100 * r.other_ms / p:.0f}% "
            f"| {100 * r.outside_ms / p:.0f}% | {r.ops_per_round:.0f} | {top} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.decode import held_out_prompts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None, help="default: the prepared SmolLM2 target")
    ap.add_argument("--head", required=True, help="an EAGLE-3 head folder")
    ap.add_argument("--peagle-head", default=None, help="a P-EAGLE head (the parallel row)")
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per prompt")
    ap.add_argument("--prompts", type=int, default=3, help="held-out chat prompts")
    args = ap.parse_args(argv)
    target = load_target(args.target or str(cached_smollm2()))
    tok = target.tokenizer
    chat = held_out_prompts(target, 2)["chat"][: args.prompts]
    prompts = [list(tok(p, add_special_tokens=False)["input_ids"]) for p in chat]
    built = engines(target, args)
    print(f"# {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    for name, engine in built.items():
        print(f"#   {name}: {engine.kernels.summary()}")
    splits = timed(built, prompts, args.tokens)
    rows = [profiled(splits[name], engine, prompts, args.tokens)
            for name, engine in built.items()]
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
