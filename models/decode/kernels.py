"""Per-host choice of the linear kernels the engine runs: measured at model load, cached.

Candidates (``CANDIDATES``, the one registry; a new kernel is one entry there):
``stock`` (``nn.Linear`` as loaded), ``onednn`` (the weight packed once for oneDNN,
models/decode/onednn.py; float32-exact) and ``bf16`` (the same packing in bfloat16: lossy,
so a candidate only where the CPU has bf16 units and the policy allows ``lossy``).

Families: the target's decoder-layer linears (``layers``), its ``lm_head`` and the draft
head's linears (``head``). Each family gets the candidate with the lowest

    score = sum over row counts r of  calls(r) * time(family, r rows)

where ``calls`` (``round_calls``) counts one decoding round. ``time`` is the fastest of a few
timed calls (after warm-up; ``measure``) applying each unit of an evenly spaced sample of
the family once, on the real weights, scaled to the whole family. A unit is what the
candidate will run: one linear, or, where ``apply`` fuses a target's sibling projections
(a repacking candidate, models/decode/fusion.py), one fused group; so the timing sees the
calls fusion saves, and the cache keeps fused timings under their own key. A family with fewer than
``min_params`` weights is not timed: it gets the first usable of ``UNTIMED_ORDER``.
Timings are cached per host and family shapes (models/decode/kernel_cache.py).
"""

from __future__ import annotations

import copy
import logging
import statistics
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from eaglenest.models.decode import kernel_cache
from eaglenest.models.decode.direct import direct_decoder
from eaglenest.models.decode.fusion import (
    SiblingSlice,
    compatible,
    concat,
    fuse_siblings,
    sibling_groups,
)
from eaglenest.models.decode.kernel_cache import Timings
from eaglenest.models.decode.onednn import OneDNNLinear, packing_available

log = logging.getLogger("eaglenest.models.decode.kernels")

FAMILIES = ("layers", "lm_head", "head")
AUTO = "auto"
LOG_PREFIX = "linear kernels: "  # how the choice's log line starts (read by benchmark reports)


@dataclass(frozen=True)
class Candidate:
    name: str
    lossless: bool  # float32-exact up to rounding: usable without the policy's ``lossy``
    usable: Callable[[nn.Linear], bool]
    build: Callable[[nn.Linear], nn.Module]  # the linear itself = keep it (no copy)
    repacks: bool = False  # builds a new weight: sibling projections may share one (fusion.py)


def _keep(linear: nn.Linear) -> nn.Module:
    return linear


def _bf16(linear: nn.Linear) -> nn.Module:
    return OneDNNLinear(linear, torch.bfloat16)


CANDIDATES: dict[str, Candidate] = {c.name: c for c in (
    Candidate("stock", True, lambda lin: True, _keep),
    Candidate("onednn", True, lambda lin: packing_available(lin.weight), OneDNNLinear, True),
    Candidate("bf16", False,
              lambda lin: packing_available(lin.weight) and kernel_cache.cpu_has_bf16(), _bf16,
              True),
)}
UNTIMED_ORDER = ("onednn", "stock")  # a family too small to time: the first usable
NOISY = 2.0  # a case's median call over this many times its fastest: a busy host


@dataclass(frozen=True)
class TimingCase:
    family: str
    candidate: str
    rows: int
    run: Callable[[], object]  # applies the family's sampled linears once each


Timer = Callable[[list[TimingCase]], list[list[float]]]  # -> each case's timed calls, ms


def interleaved_timer(cases: list[TimingCase], warmup: int = 5,
                      repeat: int = 7) -> list[list[float]]:
    """Every timed call of each case, after warm-up; the timed calls interleave (one of each
    case in turn) so that a busy spell of a shared host falls on all the cases alike."""
    for case in cases:
        for _ in range(warmup):
            case.run()
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(repeat):
        for case, out in zip(cases, times, strict=True):
            start = time.perf_counter()
            case.run()
            out.append(1000 * (time.perf_counter() - start))
    return times


def busy(calls: list[float]) -> bool:
    """True where the calls' median is over ``NOISY`` times their fastest: other processes
    took the cores during the timing."""
    return statistics.median(calls) > NOISY * min(calls)


@dataclass(frozen=True)
class KernelPolicy:
    """How the engine picks its linear kernels. ``force``: ``auto`` or a candidate name
    (every family; one that cannot run a family falls back to ``stock`` there).
    ``lossy``: ``auto`` may pick candidates that change the numerics (bf16).
    ``cache_dir``: folder of the timing cache (None: measure every time). ``in_place``:
    replace the caller's modules instead of a copy (a process that only serves). ``fuse``:
    a target's sibling projections become one linear where their candidate repacks."""

    force: str = AUTO
    lossy: bool = False
    cache_dir: Path | None = None
    in_place: bool = False
    fuse: bool = True
    min_params: int = 1_000_000
    sample_params: int = 16_000_000
    timer: Timer = interleaved_timer
    passes: int = 3  # timing passes at most, while a pass finds the host busy
    host: str | None = None  # cache key's host part (None: kernel_cache.host_key())
    candidates: Mapping[str, Candidate] = field(default_factory=lambda: CANDIDATES)


@dataclass
class KernelReport:
    """The choice per family, how it was made and the (whole-family) timings behind it."""

    choice: dict[str, str] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)  # measured|cached|forced|only|untimed
    timings: dict[str, Timings] = field(default_factory=dict)
    calls: dict[str, dict[int, float]] = field(default_factory=dict)
    seconds: float = 0.0  # spent measuring
    fused: int = 0  # sibling projection groups run as one linear (fusion.py)

    def summary(self) -> str:
        fused = f"; {self.fused} sibling groups fused" if self.fused else ""
        return ", ".join(f"{f}={c} ({self.source[f]})" for f, c in self.choice.items()) + fused

    def log_line(self) -> str:
        """One line: the choice and each candidate's score (ms per round) per family."""
        parts = []
        for fam, choice in self.choice.items():
            scores = ", ".join(f"{c} {_score(t, self.calls[fam]):.2f}"
                               for c, t in self.timings.get(fam, {}).items())
            parts.append(f"{fam}={choice} ({self.source[fam]}{'; ms/round: ' if scores else ''}"
                         f"{scores})")
        fused = f"; {self.fused} sibling groups fused" if self.fused else ""
        return f"{LOG_PREFIX}{', '.join(parts)}; measured in {self.seconds:.2f}s{fused}"

    def lines(self) -> list[str]:
        out = [f"{LOG_PREFIX}{self.summary()}; measured in {self.seconds:.2f}s"]
        for fam, per_cand in self.timings.items():
            calls = " + ".join(f"{n:g}x{r} rows" for r, n in sorted(self.calls[fam].items()))
            out.append(f"  {fam} (per round: {calls}):")
            for cand, rows in per_cand.items():
                cells = "  ".join(f"{r} rows {ms:7.2f} ms" for r, ms in sorted(rows.items()))
                out.append(f"    {cand:<8} {cells}  score {_score(rows, self.calls[fam]):.2f}")
        return out


def round_calls(verify_rows: int, draft_calls: int, draft_rows: int) -> dict[str, dict[int, float]]:
    """Calls per decoding round by family and row count: the target runs one forward over
    the verified rows (plain decoding: 1 row); the head runs ``draft_calls`` forwards of
    ``draft_rows`` rows plus one extend over the verified rows."""
    target = {verify_rows: 1.0}
    calls = {"layers": target, "lm_head": dict(target)}
    if draft_calls:
        head = {draft_rows: float(draft_calls)}
        head[verify_rows] = head.get(verify_rows, 0.0) + 1.0
        calls["head"] = head
    return calls


def _score(rows: dict[int, float], calls: dict[int, float]) -> float:
    return sum(n * rows[r] for r, n in calls.items())


def family_linears(model: nn.Module | None, head: bool = False) -> dict[str, dict[str, nn.Linear]]:
    """family -> {qualified name: linear} of ``model``'s ``nn.Linear`` modules. A head's are
    all ``head``; a causal LM's output embedding is ``lm_head``, the rest ``layers``."""
    if model is None:
        return {}
    out: dict[str, dict[str, nn.Linear]] = {}
    output = None if head else getattr(model, "get_output_embeddings", lambda: None)()
    for name, m in model.named_modules():
        if type(m) is nn.Linear:
            fam = "head" if head else "lm_head" if m is output else "layers"
            out.setdefault(fam, {})[name] = m
    return out


Unit = list[nn.Linear]  # linears run as one: a fused sibling group (fusion.py) or one linear


def timing_units(named: dict[str, nn.Linear], fused: bool) -> list[Unit]:
    """The family's linears as a candidate will run them: with ``fused`` (a repacking
    candidate on a target that ``apply`` fuses), each sibling group that
    ``fusion.fuse_siblings`` would fuse is one unit; otherwise each linear is its own."""
    if not fused:
        return [[lin] for lin in named.values()]
    units: list[Unit] = []
    for names in sibling_groups(list(named)):
        group = [named[n] for n in names]
        units += [group] if len(group) > 1 and compatible(group) else [[lin] for lin in group]
    return units


def _numel(units: list[Unit]) -> int:
    return sum(lin.weight.numel() for unit in units for lin in unit)


def _sample(units: list[Unit], budget: int) -> list[Unit]:
    """About ``budget`` weights of units: every shape's units at the same even spacing
    (each shape at least once), so the sample has the family's mix of shapes."""
    step = max(1, round(_numel(units) / max(budget, 1)))
    by_shape: dict[tuple[int, ...], list[Unit]] = {}
    for unit in units:
        shape = (sum(lin.out_features for lin in unit), unit[0].in_features)
        by_shape.setdefault(shape, []).append(unit)
    return [unit for group in by_shape.values() for unit in group[::step]]


def _build(cand: Candidate, unit: Unit) -> nn.Module:
    """The unit as the candidate runs it: a fused group is built over its concatenated
    weight (a transient copy of the sampled group only)."""
    return cand.build(unit[0]) if len(unit) == 1 else cand.build(concat(unit))


def _runner(mods: list[nn.Module], inputs: dict[int, torch.Tensor]) -> Callable[[], object]:
    @torch.no_grad()
    def run() -> None:
        for m in mods:
            m(inputs[m.in_features])  # type: ignore[index]  # [rows, in] -> [rows, out]

    return run


def measure(fam: str, units: dict[str, list[Unit]], rows: list[int],
            policy: KernelPolicy) -> tuple[Timings, bool]:
    """(each candidate's time in ms at each row count, scaled to the whole family; settled).
    ``units``: per candidate, the family's linears as that candidate runs them
    (``timing_units``). A candidate's time is its fastest call: other processes only ever
    add time (a descheduled thread stalls a whole call), so the fastest is the closest to
    the kernel's own cost, where a median flips with the neighbours' load. A pass that
    finds the host busy is followed by another (``policy.passes`` at most); ``settled`` is
    False when the last was busy too."""
    built: dict[str, list[nn.Module]] = {}
    scale: dict[str, float] = {}
    for name, family in units.items():
        sample = _sample(family, policy.sample_params)
        scale[name] = _numel(family) / _numel(sample)
        built[name] = [_build(policy.candidates[name], unit) for unit in sample]
    w = next(iter(units.values()))[0][0].weight
    widths = {lin.in_features for family in units.values() for unit in family for lin in unit}
    cases = []
    for r in rows:
        inputs = {width: torch.randn(r, width, dtype=w.dtype, device=w.device)
                  for width in widths}  # [rows, in]
        cases += [TimingCase(fam, name, r, _runner(built[name], inputs)) for name in units]
    best = [float("inf")] * len(cases)
    settled = False
    for _ in range(max(policy.passes, 1)):
        calls = policy.timer(cases)
        best = [min(b, *c) for b, c in zip(best, calls, strict=True)]
        settled = not any(busy(c) for c in calls)
        if settled:
            break
    if not settled:
        log.warning("the host stayed busy while timing the %s linears: their choice may not "
                    "hold on an idle host and is not cached", fam)
    out: Timings = {name: {} for name in units}
    for case, ms in zip(cases, best, strict=True):
        out[case.candidate][case.rows] = ms * scale[case.candidate]
    return out, settled


def _usable(linears: list[nn.Linear], policy: KernelPolicy) -> list[str]:
    return [c.name for c in policy.candidates.values()
            if (c.lossless or policy.lossy) and all(c.usable(lin) for lin in linears)]


def _decide(fam: str, named: dict[str, nn.Linear], fused: bool, policy: KernelPolicy,
            entries: dict[str, Timings], report: KernelReport) -> bool:
    """Fill the family's choice into ``report``; True where it measured something to cache.
    ``fused``: the family's repacking candidates run its sibling groups fused (timed so)."""
    linears = list(named.values())
    usable = _usable(linears, policy)
    if policy.force != AUTO:
        forced = policy.candidates[policy.force]
        ok = all(forced.usable(lin) for lin in linears)
        report.choice[fam], report.source[fam] = (forced.name if ok else "stock"), "forced"
        if not ok:
            log.warning("linear kernel %s cannot run the %s linears: stock", forced.name, fam)
        return False
    if len(usable) == 1 or sum(lin.weight.numel() for lin in linears) < policy.min_params:
        first = next((n for n in UNTIMED_ORDER if n in usable), usable[0])
        report.choice[fam], report.source[fam] = first, "only" if len(usable) == 1 else "untimed"
        return False
    host = policy.host or kernel_cache.host_key()
    shapes = [tuple(lin.weight.shape) for lin in linears]
    label = f"{fam}+fused" if fused else fam
    key = kernel_cache.family_key(host, label, shapes, str(linears[0].weight.dtype))  # type: ignore[arg-type]
    have = {n: dict(per_rows) for n, per_rows in entries.get(key, {}).items()}
    rows = sorted(report.calls[fam])
    missing = [r for r in rows if any(r not in have.get(n, {}) for n in usable)]
    settled = True
    if missing:
        units = {n: timing_units(named, fused and policy.candidates[n].repacks) for n in usable}
        fresh, settled = measure(fam, units, missing, policy)
        for name, per_rows in fresh.items():
            have.setdefault(name, {}).update(per_rows)
        if settled:
            entries[key] = have
    report.timings[fam] = {n: {r: have[n][r] for r in rows} for n in usable}
    scores = {n: _score(report.timings[fam][n], report.calls[fam]) for n in usable}
    report.choice[fam] = min(usable, key=lambda n: (scores[n], usable.index(n)))
    report.source[fam] = "cached" if not missing else "measured" if settled else "measured, busy"
    return bool(missing) and settled


def choose(families: dict[str, dict[str, nn.Linear]], calls: dict[str, dict[int, float]],
           policy: KernelPolicy, fused: frozenset[str] = frozenset()) -> KernelReport:
    """The candidate per family (see the module docstring); logs the choice and timings.
    ``fused``: the families whose sibling groups ``apply`` fuses (timed fused)."""
    if policy.force not in (AUTO, *policy.candidates):
        raise ValueError(f"unknown linear kernel {policy.force!r}: auto or "
                         + ", ".join(policy.candidates))
    started = time.perf_counter()
    report = KernelReport(calls={f: calls.get(f, {1: 1.0}) for f in families})
    entries = kernel_cache.load(policy.cache_dir) if policy.force == AUTO else {}
    measured = False
    for fam, named in families.items():
        measured |= _decide(fam, named, fam in fused, policy, entries, report)
    report.seconds = time.perf_counter() - started
    if measured:
        kernel_cache.save(policy.cache_dir, entries)
    log.info("%s", report.log_line())
    return report


_COPIES: weakref.WeakKeyDictionary[nn.Module, dict[tuple[str, ...], nn.Module]] = (
    weakref.WeakKeyDictionary())


def apply(module: nn.Module, families: dict[str, dict[str, nn.Linear]], choice: dict[str, str],
          policy: KernelPolicy) -> nn.Module:
    """``module`` with each family's linears built by its chosen candidate: ``module``
    itself where nothing changes or ``policy.in_place``, else a copy sharing every other
    parameter and buffer (one copy per module and choice; weights are packed once, so a
    module whose weights change afterwards needs a new object). A target's sibling
    projections (q/k/v, gate/up) become one linear where their candidate repacks
    (models/decode/fusion.py)."""
    plan = {name: policy.candidates[choice[fam]]
            for fam, named in families.items() for name in named}
    changes = sorted(n for n, c in plan.items() if c.build is not _keep)
    if not changes:
        return module
    signature = (*(f"{n}={plan[n].name}" for n in changes), f"fuse={policy.fuse}")
    if not policy.in_place:
        copies = _COPIES.setdefault(module, {})
        if signature in copies:
            return copies[signature]
        memo: dict[int, object] = {id(t): t for t in module.parameters()}
        memo.update({id(t): t for t in module.buffers()})
        target = copies[signature] = copy.deepcopy(module, memo)
    else:
        target = module
    if "layers" in families and "layers" in fused_families(target, policy):
        fused = fuse_siblings(target, _repacking_build(plan))
        changes = [n for n in changes if n not in fused]
    for name in changes:
        parent, _, leaf = name.rpartition(".")
        owner = target.get_submodule(parent)
        setattr(owner, leaf, plan[name].build(getattr(owner, leaf)))
    return target


def _repacking_build(plan: dict[str, Candidate]) -> Callable[[str], Callable | None]:
    def build_for(name: str) -> Callable[[nn.Linear], nn.Module] | None:
        cand = plan.get(name)
        return cand.build if cand is not None and cand.repacks else None

    return build_for


def fused_families(model: nn.Module, policy: KernelPolicy) -> frozenset[str]:
    """The families whose sibling groups ``apply`` fuses where their candidate repacks: a
    target's ``layers`` on the direct forward, unless ``policy.fuse`` is off."""
    return frozenset({"layers"} if policy.fuse and direct_decoder(model) is not None else ())


def use_kernels(model: nn.Module, head: nn.Module | None, calls: dict[str, dict[int, float]],
                policy: KernelPolicy) -> tuple[nn.Module, nn.Module | None, KernelReport]:
    """(model, head) with the chosen kernels, and the report of the choice."""
    target_fams, head_fams = family_linears(model), family_linears(head, head=True)
    report = choose({**target_fams, **head_fams}, calls, policy, fused_families(model, policy))
    fast_model = apply(model, target_fams, report.choice, policy)
    report.fused = sum(isinstance(m, SiblingSlice) and m.index == 0 for m in fast_model.modules())
    fast_head = None if head is None else apply(head, head_fams, report.choice, policy)
    return fast_model, fast_head, report
