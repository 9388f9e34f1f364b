"""The linear-kernel chooser's own benchmark (models/decode/kernels.py): every candidate per
family and row count, the choice it makes, and whole forwards with each candidate.

    python -m benchmarks.linears [--target DIR] [--rows 1,6,16] [--repeat 20]

For the target (default: the prepared SmolLM2-135M), float32 on CPU. The header names the
host and the chooser's choice for plain decoding (1 row) and for a chain round with K=5 (a
6-row verification), lossless (the default) and with bf16 allowed (``--allow-bf16``). Then,
per row count: the time of each family (the decoder-layer linears, every layer's own
weights so that they stream from memory as in a real forward, and the lm_head) under each
candidate usable on this host, measured as the chooser measures (its sample, scaled to the
whole family; a repacking candidate's sibling groups fused, as served), and of a whole
KV-cached target forward (TargetRunner over a 200-token context) with every linear on that
candidate; ratios against stock, and the largest logit difference from stock.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from eaglenest.models.decode import kernel_cache
from eaglenest.models.decode.kernels import (
    KernelPolicy,
    TimingCase,
    apply,
    choose,
    family_linears,
    fused_families,
    interleaved_timer,
    measure,
    round_calls,
    timing_units,
)
from eaglenest.models.decode.runner import TargetRunner


def _forward(model: nn.Module, rows: int) -> Callable[[], torch.Tensor]:
    runner = TargetRunner(model)
    context = list(range(100, 300))
    runner.forward(context, last_logits_only=True)
    runner.commit(context, len(context))
    new = list(range(500, 500 + rows))

    def go() -> torch.Tensor:
        out = runner.forward(new)
        runner.commit(new, 0)  # drop them again: every call sees the same 200-token context
        return out.logits  # [rows, vocab]

    return go


def _header(model: nn.Module, fused: frozenset[str]) -> None:
    fams = family_linears(model)
    print(f"# host: {kernel_cache.host_key()}; bf16 units: {kernel_cache.cpu_has_bf16()}")
    for what, calls in (("plain (1 row)", round_calls(1, 0, 1)),
                        ("chain K=5 (6-row verify)", round_calls(6, 5, 1))):
        for lossy in (False, True):
            report = choose(fams, calls, KernelPolicy(lossy=lossy), fused)
            print(f"# choice, {what}, {'bf16 allowed' if lossy else 'lossless'}: "
                  f"{report.summary()} ({report.seconds:.2f}s)")


@torch.no_grad()
def main(argv: list[str] | None = None) -> int:
    from eaglenest.models.prepare import cached_smollm2
    from eaglenest.models.target import load_target

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--rows", default="1,6,16")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args(argv)
    model: Any = load_target(args.target or str(cached_smollm2()), dtype=torch.float32).model.eval()
    fused = fused_families(model, KernelPolicy())  # as apply fuses
    _header(model, fused)
    timer = functools.partial(interleaved_timer, warmup=3, repeat=args.repeat)
    policy = KernelPolicy(lossy=True, timer=timer)
    fams = family_linears(model)
    names = [n for n, c in policy.candidates.items()
             if all(c.usable(lin) for f in fams.values() for lin in f.values())]
    copies = {n: apply(model, fams, dict.fromkeys(fams, n), policy) for n in names}
    print(f"{'rows':>4} {'what':<8} " + " ".join(f"{n + ' ms':>10} {'x':>5}" for n in names)
          + "  forward: max |logit - stock|")
    for rows in (int(r) for r in args.rows.split(",")):
        for fam, named in fams.items():
            units = {n: timing_units(named, fam in fused and policy.candidates[n].repacks)
                     for n in names}
            timings, _ = measure(fam, units, [rows], policy)
            _row(rows, fam, {n: timings[n][rows] for n in names}, "")
        forwards = {n: _forward(copies[n], rows) for n in names}
        ms = dict(zip(names, _interleaved(list(forwards.values()), args.repeat), strict=True))
        stock = forwards["stock"]()
        diffs = {n: (forwards[n]() - stock).abs().max().item() for n in names if n != "stock"}
        _row(rows, "forward", ms, " ".join(f"{n} {d:.1e}" for n, d in diffs.items()))
    return 0


def _interleaved(fns: list[Callable[[], object]], repeat: int) -> list[float]:
    """Fastest ms of each fn, timed one of each in turn (as the chooser times)."""
    cases = [TimingCase("forward", str(i), 0, fn) for i, fn in enumerate(fns)]
    return [min(calls) for calls in interleaved_timer(cases, warmup=3, repeat=repeat)]


def _row(rows: int, what: str, ms: dict[str, float], tail: str) -> None:
    cells = " ".join(f"{t:>10.2f} {ms['stock'] / t:>4.2f}x" for t in ms.values())
    print(f"{rows:>4} {what:<8} {cells}  {tail}")


if __name__ == "__main__":
    raise SystemExit(main())
