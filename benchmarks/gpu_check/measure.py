"""The four measurements of the GPU check; each takes a Bench and returns a JSON-able dict."""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from functools import partial
from typing import Any

import torch

from benchmarks.gpu_check import CEILING_FORMULA
from benchmarks.gpu_check.build import EOS, PAD, Bench, median_ms, random_ids, sync
from benchmarks.oracle import oracle_factory
from eaglenest.models.decode.modes import DecodeMode
from eaglenest.models.heads.registry import EAGLE3, HEADS, PEAGLE

K = 5  # chain / parallel drafts per round
TREE = dict(depth=5, topk=4, total_tokens=16)
MODES = ((DecodeMode.PLAIN, None), (DecodeMode.CHAIN, EAGLE3.kind), (DecodeMode.TREE, EAGLE3.kind),
         (DecodeMode.PARALLEL, PEAGLE.kind))
TOKEN_COUNTS = (1, 2, 4, 6, 8, 16, 32, 64)  # 6 = K + 1 for the ceiling at K = 5
CEILING_KS = (3, 5)
TAUS = (2, 3, 4)


def _vocab(bench: Bench) -> int:
    return int(bench.spec.config["vocab_size"])


def _engine(bench: Bench, mode: str, kind: str | None, dtype: torch.dtype, **kw: Any) -> Any:
    from eaglenest.models.decode import SpeculativeEngine

    head = None if kind is None else bench.head(kind, dtype)
    opts: dict[str, Any] = dict(k=K, **TREE)
    opts.update(kw)
    return SpeculativeEngine(bench.target(dtype), head, mode, **opts)


def hf_greedy(model: Any, prompt: list[int], n: int, eos: int = EOS, pad: int = PAD) -> list[int]:
    """transformers' greedy generate (KV cache), cut after the first ``eos``."""
    device = next(model.parameters()).device
    x = torch.tensor([prompt], device=device)
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                             do_sample=False, pad_token_id=pad, eos_token_id=eos)
    ids = out[0, len(prompt):].tolist()
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def _margin(model: Any, prompt: list[int], ref: list[int], i: int) -> float:
    """Top-1 minus top-2 logit of the target (no cache) where the reference emits ref[i]."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ref[:i]], device=device)).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def _compare(model: Any, prompts: list[list[int]], refs: list[list[int]],
             outs: list[list[int]]) -> dict[str, Any]:
    firsts, margins = [], []
    for prompt, ref, out in zip(prompts, refs, outs, strict=True):
        if out == ref:
            continue
        i = next((j for j, (a, b) in enumerate(zip(ref, out, strict=False)) if a != b),
                 min(len(ref), len(out)))
        firsts.append(i)
        margins.append(_margin(model, prompt, ref, i) if i < len(ref) else None)
    n = len(prompts)
    return {"sequences": n, "divergent": len(firsts), "divergent_rate": len(firsts) / n,
            "equal": not firsts, "first_divergence": firsts, "hf_top2_margin": margins}


def _lossless_dtype(bench: Bench, dtype: torch.dtype) -> dict[str, Any]:
    spec, target = bench.spec, bench.target(dtype)
    prompts = [random_ids(n, _vocab(bench), 10 + i) for i, n in enumerate(spec.prompts)]
    refs = [hf_greedy(target.model, p, spec.new_tokens) for p in prompts]
    rows: dict[str, Any] = {}
    for mode, kind in MODES:
        engine = _engine(bench, mode, kind, dtype)
        outs = [engine.generate_ids(p, spec.new_tokens, stop_token_ids=[EOS]) for p in prompts]
        rows[mode] = _compare(target.model, prompts, refs, outs)
        rows[mode]["tau"] = engine.stats.acceptance_length
    return rows


def lossless(bench: Bench) -> dict[str, Any]:
    """Greedy engine output vs HF generate: fp32 must be equal, bf16 is reported."""
    out: dict[str, Any] = {"new_tokens": bench.spec.new_tokens,
                           "prompt_lengths": list(bench.spec.prompts),
                           "k": K, "tree": TREE}
    out["fp32"] = _lossless_dtype(bench, torch.float32)
    out["fp32_lossless"] = all(r["equal"] for r in out["fp32"].values())
    out["bf16"] = _lossless_dtype(bench, torch.bfloat16)
    return out


def _target_curve(bench: Bench) -> dict[int, float]:
    """{n: ms} KV-cached target forward over n new tokens after ``spec.context`` tokens."""
    from eaglenest.models.decode.runner import TargetRunner

    target, spec = bench.target(bench.perf_dtype), bench.spec
    runner = TargetRunner(target.model, list(target.aux_layer_ids))  # as the engine runs it
    ctx = random_ids(spec.context, _vocab(bench), 1)
    runner.forward(ctx, last_logits_only=True)
    runner.commit(ctx, len(ctx))
    curve = {}
    for n in TOKEN_COUNTS:
        toks = random_ids(n, _vocab(bench), 2)
        curve[n] = median_ms(partial(runner.forward, toks), bench.device, spec.repeats,
                             after=partial(runner.commit, toks, 0))  # drop the n new keys
    return curve


def _draft_ms(bench: Bench, kind: str) -> dict[str, float]:
    """One round's drafting with a random head after ``spec.context`` committed slots."""
    from eaglenest.models.decode.drafter import HeadDrafter
    from eaglenest.models.decode.sampling import SamplingParams

    head: Any = bench.head(kind, bench.perf_dtype)
    spec = bench.spec
    drafter = HeadDrafter(head)
    n_aux = len(head.cfg.aux_layer_ids)
    g = torch.Generator(device=bench.device).manual_seed(0)
    aux = torch.randn(spec.context, n_aux * head.cfg.hidden_size, generator=g,
                      device=bench.device, dtype=bench.perf_dtype)
    with torch.no_grad():
        feats = head.combine(aux)
    drafter.extend(random_ids(spec.context, _vocab(bench), 3), feats)
    draft = drafter.draft_parallel if HEADS[kind].parallel else drafter.draft_chain
    greedy = SamplingParams()
    out = {}
    for k in CEILING_KS:
        out[f"draft_{k}"] = median_ms(partial(draft, k, greedy, None), bench.device,
                                      spec.repeats)
    two, slots = random_ids(2, _vocab(bench), 4), drafter.slots

    def undo() -> None:
        drafter.slots = slots
        drafter.crop()

    out["extend_2"] = median_ms(lambda: drafter.extend(two, feats[:2]), bench.device,
                                spec.repeats, after=undo)
    return out


def _ceiling(curve: dict[int, float], drafts: dict[str, dict[str, float]]) -> list[dict]:
    rows = []
    for name, ms in [("verify_only", None), *drafts.items()]:
        for k in CEILING_KS:
            t_draft = 0.0 if ms is None else ms[f"draft_{k}"] + ms["extend_2"]
            t_round = curve[k + 1] + t_draft
            speed = {str(tau): tau * curve[1] / t_round for tau in TAUS if tau <= k + 1}
            rows.append({"drafting": name, "k": k, "t_draft_ms": t_draft,
                         "t_verify_ms": curve[k + 1], "speedup": speed})
    return rows


def verify_cost(bench: Bench) -> dict[str, Any]:
    curve = _target_curve(bench)
    drafts: dict[str, Any] = {DecodeMode.CHAIN: _draft_ms(bench, EAGLE3.kind),
                              DecodeMode.PARALLEL: _draft_ms(bench, PEAGLE.kind)}
    return {"dtype": str(bench.perf_dtype).removeprefix("torch."), "context": bench.spec.context,
            "token_counts": list(TOKEN_COUNTS), "repeats": bench.spec.repeats,
            "curve": [{"n": n, "ms": ms} for n, ms in curve.items()],
            "draft_ms": drafts, "ceiling": _ceiling(curve, drafts),
            "formula": CEILING_FORMULA}


def _timed(fn: Any, n: int, bench: Bench) -> tuple[float, list[int]]:
    """(tokens/s, output) of one ``fn(n)``, the device synchronised on both sides."""
    sync(bench.device)
    t0 = time.perf_counter()
    out = fn(n)
    sync(bench.device)
    return len(out) / (time.perf_counter() - t0), out


def _interleaved(fns: dict[str, Any], bench: Bench) -> dict[str, tuple[float, list[int]]]:
    """Per row: (median tokens/s of ``fn(bench_tokens)`` over ``bench_repeats`` rounds, the last
    output). Every round runs every row once in turn, so a slow spell of the host lands on all
    rows rather than on one; each row's last call is its last timed one."""
    for fn in fns.values():
        fn(8)  # warm-up: kernels, allocator, caches
    rates: dict[str, list[float]] = {name: [] for name in fns}
    last: dict[str, list[int]] = {}
    for _ in range(bench.spec.bench_repeats):
        for name, fn in fns.items():
            rate, last[name] = _timed(fn, bench.spec.bench_tokens, bench)
            rates[name].append(rate)
    return {name: (statistics.median(r), last[name]) for name, r in rates.items()}


def _row_set(bench: Bench, dtype: torch.dtype, prompt: list[int],
             heads: bool) -> tuple[dict[str, Any], dict[str, Any], list[int]]:
    """(timed callables by row name, engines by row name, plain output) of one dtype: HF
    generate, plain, the oracle chain and, with ``heads``, the random-head chain / parallel."""
    n, suffix = bench.spec.bench_tokens, "" if dtype == bench.perf_dtype else f" {_name(dtype)}"
    target = bench.target(dtype)
    plain_engine = _engine(bench, DecodeMode.PLAIN, None, dtype)
    # the oracle drafts what plain decoding emits, so plain's output is read once, untimed
    plain = plain_engine.generate_ids(prompt, n, stop_token_ids=[EOS])
    engines = {"ours plain": plain_engine}
    if heads:
        engines[f"ours chain K={K}"] = _engine(bench, DecodeMode.CHAIN, EAGLE3.kind, dtype)
        engines[f"ours parallel K={K}"] = _engine(bench, DecodeMode.PARALLEL, PEAGLE.kind, dtype)
    oracle = oracle_factory(prompt + plain, EOS)
    engines[f"ours chain K={K} oracle"] = _engine(bench, DecodeMode.CHAIN, None, dtype,
                                                 drafter_factory=oracle)
    fns: dict[str, Any] = {"hf generate" + suffix: lambda k: hf_greedy(target.model, prompt, k)}
    for name, engine in engines.items():
        fns[name + suffix] = partial(engine.generate_ids, prompt, stop_token_ids=[EOS])
    return fns, {name + suffix: e for name, e in engines.items()}, plain


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def throughput(bench: Bench) -> dict[str, Any]:
    """Batch-1 tokens/s on one prompt: HF generate and the engine's modes in the fast dtype,
    rows interleaved. Where that dtype is not fp32 (CUDA: bf16), HF / plain / oracle rows in
    exact fp32 follow, interleaved among themselves (on CUDA the Bench holds one copy of the
    weights, so the dtypes cannot share rounds): only there is verification bit-equal to
    one-token steps, so only there does the oracle row show the engine's ceiling."""
    spec = bench.spec
    prompt = random_ids(spec.bench_prompt, _vocab(bench), 7)
    dtypes = [bench.perf_dtype] + ([torch.float32] if bench.perf_dtype != torch.float32 else [])
    rows: list[dict[str, Any]] = []
    for dtype in dtypes:
        fns, engines, plain = _row_set(bench, dtype, prompt, heads=dtype == bench.perf_dtype)
        timed = _interleaved(fns, bench)
        hf_name = next(iter(fns))
        hf_rate = timed[hf_name][0]
        rows.append({"name": hf_name, "dtype": _name(dtype), "tokens_per_s": hf_rate,
                     "tau": None, "tokens": None})
        for name, engine in engines.items():
            rate, out = timed[name]  # request_stats: that last timed call's
            tau = engine.request_stats.acceptance_length if engine.mode.spec.drafts else None
            rows.append({"name": name, "dtype": _name(dtype), "tokens_per_s": rate, "tau": tau,
                         "tokens": len(out), "equal_to_plain": out == plain})
        for row in rows[-len(fns):]:
            row["speedup_vs_hf"] = row["tokens_per_s"] / hf_rate
    return {"dtype": _name(bench.perf_dtype), "rounds": spec.bench_repeats,
            "prompt_tokens": spec.bench_prompt, "new_tokens": spec.bench_tokens, "rows": rows}


def _capture_ms(bench: Bench, target: Any, autocast: Any) -> float:
    ids = torch.tensor([random_ids(bench.spec.seq_len, _vocab(bench), 5)], device=bench.device)

    def run() -> None:
        with autocast:
            target.capture(ids)

    return median_ms(run, bench.device, 3, warmup=1)


def training(bench: Bench) -> dict[str, Any]:
    """models.training.train steps/s per head kind after ``train_warmup`` steps (captures
    cached)."""
    from eaglenest.models.training.config import TrainConfig
    from eaglenest.models.training.train import TrainData, train

    spec, cuda = bench.spec, bench.device.type == "cuda"
    target = bench.target(bench.perf_dtype)  # as models.commands loads it
    autocast = torch.autocast("cuda", torch.bfloat16) if cuda else contextlib.nullcontext()
    rows = []
    for kind in (EAGLE3.kind, PEAGLE.kind):
        ticks: list[float] = []

        def tick(ticks: list[float] = ticks) -> bool:
            sync(bench.device)
            ticks.append(time.perf_counter())  # before every step
            return False

        steps = spec.train_warmup + spec.train_steps + 1  # the tick before the last step ends it
        cfg = TrainConfig(head=kind, max_steps=steps, batch_size=2, warmup_steps=2, progress=False,
                          draft_vocab_size=spec.draft_vocab, should_stop=tick)
        result = train(cfg, TrainData(target, bench.samples(), "random tokens"), bench.device)
        span = ticks[spec.train_warmup + spec.train_steps] - ticks[spec.train_warmup]
        rows.append({"head": kind, "steps_per_s": spec.train_steps / span,
                     "tokens_per_s": spec.train_steps * 2 * spec.seq_len / span,
                     "loss": result.loss, "loss_finite": math.isfinite(result.loss),
                     "steps": result.steps})
        del result
    return {"autocast": "bfloat16" if cuda else "none (fp32 on CPU)", "batch_size": 2,
            "seq_len": spec.seq_len, "warmup_steps": spec.train_warmup,
            "timed_steps": spec.train_steps, "optimizer": TrainConfig().optimizer,
            "capture_ms": _capture_ms(bench, target, autocast), "heads": rows}
