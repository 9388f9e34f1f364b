"""Public API: ``SpeculativeEngine`` -- plain, chain, EAGLE-2 tree, P-EAGLE parallel and
DFlash block decoding.

    engine = SpeculativeEngine(target, head, DecodeMode.TREE, depth=5, topk=4, total_tokens=16)
    for new_ids in engine.generate(prompt_ids, max_new_tokens=64):
        ...                                   # tokens accepted this step (stream them)
    engine.request_stats.acceptance_length    # tau of the last request; engine.stats: all

One request state (``_Request``): the target KV holds x[0..L-1]; ``pending`` = x[L] is
committed (already emitted) but not yet run by the target. Every round runs the pending
token plus the drafts through the target in one forward, keeps the accepted drafts' KV
entries, and emits the accepted drafts plus one target token (correction or bonus), which
becomes the new pending token. ``head=None`` (or mode PLAIN) runs the same loop with no
drafts: that is the reference greedy / sampling decoder.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from eaglenest.models.decode.adaptive import AdaptiveDepth
from eaglenest.models.decode.block import BlockDrafter
from eaglenest.models.decode.direct import direct_decoder
from eaglenest.models.decode.drafter import HeadDrafter
from eaglenest.models.decode.kernels import KernelPolicy, KernelReport, round_calls, use_kernels
from eaglenest.models.decode.modes import DecodeMode, Decoding, ModeSpec, refusal
from eaglenest.models.decode.runner import StepOutput, TargetRunner
from eaglenest.models.decode.sampling import (
    SamplingParams,
    sample,
    target_probs,
    verify_greedy,
    verify_rejection,
)
from eaglenest.models.decode.stats import SpecStats
from eaglenest.models.decode.tree import accepted_path, build_tree, walk_greedy, walk_sampling
from eaglenest.models.heads.base import draft_head
from eaglenest.models.heads.registry import find_head_spec

if TYPE_CHECKING:
    from eaglenest.models.target import Target

__all__ = ["DecodeMode", "SpeculativeEngine"]


@dataclass
class _Request:
    runner: TargetRunner
    drafter: HeadDrafter | None
    params: SamplingParams
    gen: torch.Generator | None
    stop: frozenset[int]
    max_new: int
    pending: int = -1
    emitted: int = 0
    done: bool = False
    stats: SpecStats = field(default_factory=SpecStats)


def _causal_lm(target: nn.Module | Target) -> nn.Module:
    """A models.target.Target or a transformers causal LM -> the causal LM."""
    from eaglenest.models.target import Target

    return target.model if isinstance(target, Target) else target


class SpeculativeEngine:
    """Batch-1 speculative decoding of one target with an optional draft head."""

    def __init__(
        self,
        target: nn.Module | Target,
        head: nn.Module | None = None,
        mode: DecodeMode | str = DecodeMode.CHAIN,
        k: int = 4,
        adaptive: bool = False,
        depth: int = 5,
        topk: int = 4,
        total_tokens: int = 16,
        k_max: int | None = None,
        drafter_factory: Callable[[], HeadDrafter] | None = None,
        kernels: KernelPolicy | None = None,
        direct: bool = True,
    ) -> None:
        """``drafter_factory`` replaces the head with any HeadDrafter-like draft source (tests
        use oracle drafters); either it or ``head`` turns speculation on. ``kernels``: how
        the target's and head's linears are run (models/decode/kernels.py; default: timed
        per family at load, float32-exact candidates only, no cache); ``self.kernels``
        reports the choice. ``k_max``: the largest K (or depth) adaptive rounds may choose
        (default: the mode's ``ModeSpec.adaptive_k_max``). ``direct``: run the target's
        direct forward where it has one (models/decode/direct.py); False: transformers'
        forward (the benchmarks' side-by-side row)."""
        self.model: nn.Module = _causal_lm(target).eval()
        self.head = head.eval() if head is not None else None
        self.drafter_factory = drafter_factory
        self.direct = direct
        speculative = head is not None or drafter_factory is not None
        self.mode = DecodeMode(mode) if speculative else DecodeMode.PLAIN
        spec = find_head_spec(head) if head is not None else None
        if spec is not None and drafter_factory is None:
            reason = refusal(self.mode, spec)
            if reason is not None:
                raise ValueError(reason)
        self.note = ""
        cap = self.k_limit = self._block_cap()  # None: no limit but the mode's
        if cap is not None and k > cap:
            k, self.note = cap, f"K capped at the head's block_size - 1 = {cap}"
        self.k, self.depth, self.topk, self.total_tokens = k, depth, topk, total_tokens
        layer_types = getattr(self.model.config, "layer_types", None) or []
        if self.mode.spec.tree and "linear_attention" in layer_types:
            # recurrent layers read tokens in sequence: a tree cannot share one forward
            self.mode, self.k = DecodeMode.CHAIN, depth
            self.note = "tree mode needs attention-only targets; using chain drafting"
        start = depth if self.mode.spec.tree else k
        self.k_max = k_max
        self.controller: AdaptiveDepth | None = None
        if adaptive and self.mode.spec.drafts:
            self.controller = self.new_controller(self.mode, start)
        self.current_k = start
        #: rounds (BatchEngine: steps) run in each decoding (Decoding.name; "plain": K = 0)
        self.steps_by_decoding: dict[str, int] = {}
        self.kernels = self._use_kernels(kernels or KernelPolicy())
        self.stats = SpecStats()
        self.request_stats = SpecStats()

    def new_controller(self, mode: DecodeMode, start: int) -> AdaptiveDepth:
        """An adaptive-depth controller for ``mode``, K at most ``k_max`` (default: the mode's
        ``ModeSpec.adaptive_k_max``; a block head's block_size - 1) and at least ``start``.
        Chain and parallel controllers may also choose plain rounds (ModeSpec)."""
        spec, cap = mode.spec, self.k_limit
        deepest = self.k_max if self.k_max is not None else spec.adaptive_k_max
        return AdaptiveDepth(k_min=spec.adaptive_k_min,
                             k_max=max(min(deepest, cap if cap is not None else deepest), start),
                             parallel=spec.parallel, block=spec.block)

    @property
    def decoding(self) -> str:
        """The decoding rounds run now: a Decoding name ("tree", "chain+adaptive"), or
        "plain" without drafts."""
        if not self.mode.spec.drafts:
            return DecodeMode.PLAIN.value
        return Decoding(self.mode, self.controller is not None).name

    def count_step(self, k: int) -> None:
        """Count one round (or batched step) of draft depth ``k`` in ``steps_by_decoding``."""
        name = self.decoding if k > 0 else DecodeMode.PLAIN.value
        self.steps_by_decoding[name] = self.steps_by_decoding.get(name, 0) + 1

    def _block_cap(self) -> int | None:
        """The largest K of a block head (its block_size - 1); None outside block mode or
        for a drafter factory (tests' oracles)."""
        if not self.mode.spec.block or self.head is None:
            return None
        size = draft_head(self.head).cfg.block_size
        return max(int(size) - 1, 1) if size else None

    def _use_kernels(self, policy: KernelPolicy) -> KernelReport:
        """Choose the linear kernels for this engine's round shape (kernels.round_calls):
        chain K drafts of 1 row, tree ``depth`` drafts of ``topk`` rows, parallel one of K,
        block one of K + 1 (the anchor and K mask slots)."""
        spec, k = self.mode.spec, self.current_k
        if not spec.drafts:
            calls = round_calls(1, 0, 1)
        elif spec.tree:
            calls = round_calls(self._size_of(k), k, self.topk)
        elif spec.block:
            calls = round_calls(k + 1, 1, k + 1)
        else:
            calls = round_calls(k + 1, 1 if spec.parallel else k, k if spec.parallel else 1)
        self.model, self.head, report = use_kernels(self.model, self.head, calls, policy)
        return report

    # ---- public ------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop_token_ids: Sequence[int] = (),
        seed: int | None = None,
    ) -> Iterator[list[int]]:
        """Yield the newly accepted token ids of every step (stop tokens included, then end)."""
        req = self._new_request(prompt_ids, max_new_tokens, temperature, top_p, stop_token_ids,
                                seed)
        self.request_stats = req.stats
        started = time.perf_counter()
        try:
            if max_new_tokens <= 0:
                return
            yield self._prefill(req, list(prompt_ids))
            while not req.done:
                yield self._round(req)
        finally:
            req.stats.elapsed_seconds = time.perf_counter() - started
            self.stats.merge(req.stats)

    def generate_ids(
        self, prompt_ids: Sequence[int], max_new_tokens: int, **kw: Any
    ) -> list[int]:
        """All generated ids of one request (convenience over ``generate``)."""
        out: list[int] = []
        for chunk in self.generate(prompt_ids, max_new_tokens, **kw):
            out.extend(chunk)
        return out

    def generate_batch(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, **kw: Any
    ) -> list[list[int]]:
        """Several requests, decoded one after another (no batched forwards yet)."""
        return [self.generate_ids(p, max_new_tokens, **kw) for p in prompts]

    # ---- request lifecycle ---------------------------------------------------------------
    def _new_request(self, prompt_ids: Sequence[int], max_new: int, temperature: float,
                     top_p: float, stop: Sequence[int], seed: int | None) -> _Request:
        """A request's state (its prompt is fed by the caller); refuses an empty prompt."""
        if not prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        drafter = None
        if self.controller is not None:
            self.controller.new_context()
        if self.mode.spec.drafts:
            factory = self.drafter_factory
            if factory is not None:
                drafter = factory()
            else:
                assert self.head is not None  # a drafting mode has a head or a factory
                drafter = (BlockDrafter if self.mode.spec.block else HeadDrafter)(self.head)
        aux = drafter.aux_layer_ids if drafter is not None else []
        device = next(self.model.parameters()).device
        gen = None
        if temperature > 0:
            gen = torch.Generator(device=device)
            gen.manual_seed(seed if seed is not None else int(torch.seed() % (2**63)))
        return _Request(
            runner=TargetRunner(self.model, aux, direct=self.direct),
            drafter=drafter,
            params=SamplingParams(temperature, top_p),
            gen=gen,
            stop=frozenset(int(t) for t in stop),
            max_new=max_new,
        )

    def forward_kind(self) -> str:
        """``direct`` (models/decode/direct.py) or ``transformers``: what a request runs."""
        return "direct" if self.direct and direct_decoder(self.model) else "transformers"

    def _prefill(self, req: _Request, prompt: list[int]) -> list[int]:
        out = req.runner.forward(prompt, last_logits_only=True)
        req.runner.commit(prompt, len(prompt))
        req.stats.num_target_forwards += 1
        first = self._pick(req, out.logits[-1])
        emitted = self._emit(req, [first])
        if not req.done and req.drafter is not None:
            self._commit_head(req.drafter, prompt[1:] + [first], out)
        return emitted

    def _commit_head(self, drafter: HeadDrafter, tokens: list[int], out: StepOutput) -> None:
        """The prompt's head slots (BatchEngine defers them to its step's drafting)."""
        drafter.extend(tokens, drafter.features(out, slice(None)))

    def _pick(self, req: _Request, logits: torch.Tensor) -> int:
        if req.params.greedy:
            return int(logits.argmax())
        return sample(target_probs(logits, req.params), req.gen)

    def _emit(self, req: _Request, tokens: list[int]) -> list[int]:
        """Truncate at a stop token (kept) or at max_new_tokens; set ``pending``."""
        out = []
        for t in tokens:
            out.append(t)
            req.emitted += 1
            if t in req.stop or req.emitted >= req.max_new:
                req.done = True
                break
        req.pending = out[-1]
        req.stats.num_emitted_tokens += len(out)
        return out

    def _round(self, req: _Request) -> list[int]:
        req.stats.num_target_forwards += 1
        self.count_step(0 if req.drafter is None else self.current_k)
        if req.drafter is None:
            out = req.runner.forward([req.pending])
            req.runner.commit([req.pending], 1)
            return self._emit(req, [self._pick(req, out.logits[0])])
        start = time.perf_counter()
        if self.mode.spec.tree:
            emitted = self._round_tree(req, req.drafter)
        else:
            emitted = self._round_chain(req, req.drafter)
        if self.controller is not None:  # the round's fixed cost (head extend, emit): for the
            self.controller.observe_round(time.perf_counter() - start)  # next round's choice
        return emitted

    # ---- drafting rounds -----------------------------------------------------------------
    def _round_chain(self, req: _Request, drafter: HeadDrafter) -> list[int]:
        k = self.current_k
        t0 = time.perf_counter()
        drafts, q = draft_sequence(drafter, self.mode.spec, k, req.params, req.gen)
        t1 = time.perf_counter()
        tokens = [req.pending] + drafts
        out = req.runner.forward(tokens)
        if req.params.greedy:
            accepted, nxt = verify_greedy(out.logits, drafts)
        else:
            p = target_probs(out.logits, req.params)
            accepted, nxt = verify_rejection(p, drafts, q, req.gen)
        req.runner.commit(tokens, accepted + 1)
        t2 = time.perf_counter()
        self._account(req, k, accepted, t1 - t0, t2 - t1, len(tokens))
        new = drafts[:accepted] + [nxt]
        return self._finish_round(req, drafter, new, out, list(range(accepted + 1)))

    def _round_tree(self, req: _Request, drafter: HeadDrafter) -> list[int]:
        depth = self.current_k
        total = self._tree_size(depth)
        t0 = time.perf_counter()
        tree = build_tree(drafter, req.pending, depth, self.topk, total)
        t1 = time.perf_counter()
        depths = torch.tensor(tree.depths)
        out = req.runner.forward(tree.tokens, depths=depths, tree=tree.mask)
        if req.params.greedy:
            path, nxt = walk_greedy(tree, out.logits)
        else:
            path, nxt = walk_sampling(tree, target_probs(out.logits, req.params), req.gen)
        rows = accepted_path(tree, path)  # [root, accepted nodes...] ascending indices
        req.runner.keep(rows)
        t2 = time.perf_counter()
        self._account(req, depth, len(path), t1 - t0, t2 - t1, len(tree.tokens))
        req.stats.num_draft_tokens += len(tree.tokens) - 1 - depth  # record() counted depth
        new = [tree.tokens[i] for i in rows[1:]] + [nxt]
        return self._finish_round(req, drafter, new, out, rows)

    def _finish_round(
        self,
        req: _Request,
        drafter: HeadDrafter,
        new: list[int],
        out: StepOutput,
        rows: list[int],
    ) -> list[int]:
        """Emit the round's tokens; commit the head slots (token x[i+1], feature of row i)."""
        emitted = self._emit(req, new)
        if not req.done:
            drafter.extend(new, drafter.features(out, rows))
        return emitted

    def _account(
        self, req: _Request, k: int, accepted: int, draft_s: float, verify_s: float, size: int
    ) -> None:
        req.stats.record(k, accepted)
        req.stats.draft_seconds += draft_s
        req.stats.verify_seconds += verify_s
        if self.controller is not None:
            self.controller.update(k, accepted, draft_s, verify_s, size)
            self.current_k = self.controller.choose(self._size_of)

    def _size_of(self, k: int) -> int:
        """Tokens verified in a round of depth / K ``k``."""
        return self._tree_size(k) if self.mode.spec.tree else k + 1

    def _tree_size(self, depth: int) -> int:
        """Tree nodes (root included) for a depth: total_tokens scaled with the depth."""
        scaled = round(self.total_tokens * depth / max(self.depth, 1))
        return max(depth + 1, min(scaled, 1 + self.topk + (depth - 1) * self.topk**2))


def draft_sequence(drafter: HeadDrafter, mode: ModeSpec, k: int, params: SamplingParams,
                   gen: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
    """A sequence mode's k drafts for one request: a block forward (block heads), one
    forward over mask slots (parallel heads) or k - 1 head steps (chain)."""
    if mode.block:
        return cast(BlockDrafter, drafter).draft_block(k, params, gen)
    if mode.parallel:
        return drafter.draft_parallel(k, params, gen)
    return drafter.draft_chain(k, params, gen)
