"""Stock PyTorch linears vs oneDNN-packed ones (models/decode/onednn.py), side by side.

    python -m benchmarks.linears [--target DIR] [--rows 1,6,16] [--repeat 20]

For the target (default: the prepared SmolLM2-135M), float32 on CPU, prints per row count:
the time of all its decoder linears applied once each (every layer's own weights, so
weights stream from memory as in a real forward), of the lm_head, and of a whole KV-cached
target forward (TargetRunner over a 200-token context) with the stock model and with the
engine's oneDNN copy, plus their ratio. Also checks the two forwards' logits agree.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from eaglenest.models.decode.onednn import OneDNNLinear, onednn_copy
from eaglenest.models.decode.runner import TargetRunner


def _ms(fn: Callable[[], object], repeat: int) -> float:
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return 1000 * (time.perf_counter() - start) / repeat


def _linears(model: Any) -> list[Any]:
    return [m for m in model.model.layers.modules() if isinstance(m, nn.Linear | OneDNNLinear)]


def _apply_all(layers: list[Any], rows: int) -> Callable[[], None]:
    inputs = {m.in_features: torch.randn(rows, m.in_features) for m in layers}

    def go() -> None:
        for m in layers:
            m(inputs[m.in_features])

    return go


def _forward(model: nn.Module, rows: int) -> Callable[[], torch.Tensor]:
    runner = TargetRunner(model)
    context = list(range(100, 300))
    runner.forward(context, last_logits_only=True)
    runner.commit(context, len(context))
    new = list(range(500, 500 + rows))

    def go() -> torch.Tensor:
        out = runner.forward(new)
        runner.commit(new, 0)  # drop them again: every call sees the same 200-token context
        return out.logits

    return go


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
    fast: Any = onednn_copy(model)
    print(f"{'rows':>4} {'what':<12} {'stock ms':>9} {'oneDNN ms':>10} {'speedup':>8}")
    for rows in (int(r) for r in args.rows.split(",")):
        pairs = {
            "layer linears": (_apply_all(_linears(model), rows), _apply_all(_linears(fast), rows)),
            "lm_head": (_apply_all([model.lm_head], rows), _apply_all([fast.lm_head], rows)),
            "forward": (_forward(model, rows), _forward(fast, rows)),
        }
        for what, (stock, packed) in pairs.items():
            a, b = _ms(stock, args.repeat), _ms(packed, args.repeat)
            print(f"{rows:>4} {what:<12} {a:>9.2f} {b:>10.2f} {a / b:>7.2f}x")
        diff = (pairs["forward"][0]() - pairs["forward"][1]()).abs().max().item()  # type: ignore[operator]
        print(f"{rows:>4} max |logit difference| {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
