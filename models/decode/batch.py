"""Continuous batching: ``BatchEngine`` decodes many requests with ONE target forward a step.

    engine = BatchEngine(target, head, DecodeMode.CHAIN, k=4, max_num_seqs=8)
    a = engine.submit(prompt_a, max_new_tokens=64)
    b = engine.submit(prompt_b, max_new_tokens=16, temperature=0.7, seed=1)
    while engine.has_work:
        for rid, new_ids, finished in engine.step():   # requests may join between steps
            ...

A step: (1) admit waiting requests (up to ``max_num_seqs`` active): each is prefilled on its
own (a batch-1 forward, exactly as ``SpeculativeEngine``) and its KV joins ``BatchKV`` as a
new row; (2) every active request drafts with its own head KV cache, sampling parameters and
generator; chain, parallel and block drafts of all rows come from batched head forwards
(K - 1 head steps a step for the whole batch, one for P-EAGLE: batch_draft.py, one block
forward for DFlash: block.py), EAGLE-2 trees are built row by row; (3) one target forward
verifies all rows' tokens (padded, per-row positions and masks, see batch_kv.py); (4) every
row verifies and emits like ``SpeculativeEngine`` and keeps its accepted KV columns, then
the accepted tokens of all rows enter their head caches in one batched head forward;
finished rows leave.
Each request keeps its own ``SpecStats``, merged into ``engine.stats`` when it finishes.
All modes share the batched verification (a tree is just a row with a tree mask). With
``adaptive`` one controller serves the batch: K is read once per step for every row and
each row's round is recorded with the whole batched forward's time as its verify cost.
A ``schedule`` chooses each step's K, and its decoding where an entry names one (chain,
tree, parallel, block, "+adaptive"): the engine switches mode and controller between steps
(models/decode/batch_schedule.py); ``steps_by_decoding`` counts the steps of each.

Greedy output equals the batch-1 engine's token for token in fp32 (tests/models/decode/
test_batch.py), also when the decoding changes between steps (tests/models/decode/
test_schedule_batch.py); sampled output follows the same per-request generator sequence.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from eaglenest.models.decode import batch_draft, batch_schedule
from eaglenest.models.decode.batch_kv import BatchKV
from eaglenest.models.decode.batch_schedule import Entry, Lane
from eaglenest.models.decode.drafter import HeadDrafter
from eaglenest.models.decode.engine import DecodeMode, SpeculativeEngine, _Request, draft_sequence
from eaglenest.models.decode.runner import StepOutput
from eaglenest.models.decode.sampling import target_probs, verify_greedy, verify_rejection
from eaglenest.models.decode.tree import (
    DraftTree,
    accepted_path,
    build_tree,
    walk_greedy,
    walk_sampling,
)
from eaglenest.models.heads.registry import find_head_spec

Event = tuple[int, list[int], bool]  # (request id, tokens emitted this step, finished)


@dataclass
class _Plan:
    """One row's tokens for the batched forward, and what verification needs."""

    tokens: list[int]  # [q] pending token + drafts (chain) or tree nodes
    depths: list[int]  # [q] position offsets from the row's length
    local: torch.Tensor  # [q, q] bool: which new tokens each new token sees
    k: int = 0  # drafts (chain) or tree depth; 0 = plain
    drafts: list[int] | None = None
    q: torch.Tensor | None = None  # [k, vocab] draft distributions (sampling)
    tree: DraftTree | None = None
    draft_s: float = 0.0


@dataclass
class _Slot:
    rid: int
    req: _Request
    started: float


class BatchEngine(SpeculativeEngine):
    """``SpeculativeEngine`` (its batch-1 ``generate`` still works) plus a batched step loop.
    Not thread-safe: one thread calls submit / step / cancel."""

    def __init__(
        self,
        target: nn.Module,
        head: nn.Module | None = None,
        mode: DecodeMode | str = DecodeMode.CHAIN,
        max_num_seqs: int = 8,
        compact_slack: int = 32,
        batched_drafting: bool = True,
        schedule: Sequence[Entry] | None = None,
        **kw: Any,
    ) -> None:
        """``batched_drafting=False`` drafts row by row (the benchmark's side-by-side row).
        ``schedule``: ``[(max_running, K[, decoding]), ...]`` ascending; each step drafts K of
        the first entry with ``max_running >=`` the rows in the batch (the last entry's K
        beyond it), K = 0 being a plain step, in the entry's decoding (None: ``mode`` and
        ``adaptive``). An adaptive decoding's controller chooses at most that K, and starts
        from it whenever the scheduled K changes. ValueError when a scheduled decoding does
        not suit the head (models/decode/modes.py ``refusal``)."""
        super().__init__(target, head, mode, **kw)
        self.batched_drafting = batched_drafting
        self.schedule = batch_schedule.steps(schedule) if schedule else None
        self._cap: int | None = None  # the scheduled K of the last step
        self._lanes_for(head)
        self.rounds_by_k: dict[int, int] = {}  # steps run at each K (0 = plain steps)
        self.last_k: int | None = None
        self._admitting = False  # inside _admit: prompts' head prefills are deferred
        if "linear_attention" in (getattr(self.model.config, "layer_types", None) or []):
            raise ValueError("batched decoding needs an attention-only target")
        self.max_num_seqs = max(1, max_num_seqs)
        self.compact_slack = compact_slack
        self.kv: BatchKV | None = None
        self.waiting: deque[tuple[_Slot, list[int]]] = deque()
        self.active: list[_Slot] = []  # active[b] is BatchKV row b
        self._next_id = 0
        # head slots to commit after a batched verification: (drafter, tokens, features)
        self._deferred: list[tuple[HeadDrafter, list[int], torch.Tensor]] | None = None

    # ---- public ------------------------------------------------------------------------
    def submit(self, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
               top_p: float = 1.0, stop_token_ids: Sequence[int] = (),
               seed: int | None = None) -> int:
        """Queue a request (``generate``'s parameters); it joins the batch at the next step.
        Returns its id."""
        req = self._new_request(prompt_ids, max_new_tokens, temperature, top_p, stop_token_ids,
                                seed)
        rid, self._next_id = self._next_id, self._next_id + 1
        self.waiting.append((_Slot(rid, req, 0.0), list(prompt_ids)))
        return rid

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.active)

    def cancel(self, rid: int) -> None:
        """Drop a request now (e.g. a stop string matched or the client went away)."""
        self.waiting = deque(w for w in self.waiting if w[0].rid != rid)
        rows = [b for b, s in enumerate(self.active) if s.rid == rid]
        self._retire(rows)

    def abort_all(self) -> None:
        """Forget every request (after a failed step the batch state cannot be trusted)."""
        self.waiting.clear()
        self.active, self.kv = [], None

    @torch.no_grad()
    def step(self, on_admitted: Callable[[list[Event]], None] | None = None) -> list[Event]:
        """Admit, draft, verify all active requests in one target forward, retire.

        ``on_admitted`` receives the newly admitted requests' first tokens (from their
        prefill) before the batched forward, and those events are then left out of the
        returned list: a caller that sends them at once gives a request a time to first token
        of its prefill, not its prefill plus a whole draft-and-verify step of the batch. The
        callback must not call ``cancel`` (the step is in progress): cancel after it returns.
        """
        events = self._admit()
        if on_admitted is not None and events:
            on_admitted(events)
            events = []
        if not self.active:
            return events
        assert self.kv is not None
        k = self._step_k(len(self.active))
        self.rounds_by_k[k] = self.rounds_by_k.get(k, 0) + 1
        self.count_step(k)
        self.last_k = k
        plans = self._plans(k)
        t0 = time.perf_counter()
        logits, last, aux = self.kv.forward(
            [p.tokens for p in plans], [p.depths for p in plans], [p.local for p in plans]
        )
        verify_s = time.perf_counter() - t0
        self._deferred = []
        try:
            for b, (slot, plan) in enumerate(zip(self.active, plans, strict=True)):
                n = len(plan.tokens)
                out = StepOutput(logits[b, :n], last[b, :n], None if aux is None else aux[b, :n])
                emitted, kept = self._verify(slot.req, plan, out, verify_s)
                self.kv.commit(b, kept)
                events.append((slot.rid, emitted, slot.req.done))
            self._extend_rows(self._deferred)
        finally:
            self._deferred = None
        self._retire([b for b, s in enumerate(self.active) if s.req.done])
        return events

    def generate_batch(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, **kw: Any
    ) -> list[list[int]]:
        """Several requests decoded together (same parameters); outputs in prompt order."""
        ids = [self.submit(p, max_new_tokens, **kw) for p in prompts]
        outs: dict[int, list[int]] = {rid: [] for rid in ids}
        while self.has_work:
            for rid, new, _ in self.step():
                outs[rid].extend(new)
        return [outs[rid] for rid in ids]

    # ---- the schedule ----------------------------------------------------------------------
    def _lanes_for(self, head: nn.Module | None) -> None:
        """One Lane per decoding the engine may run: its own, and each scheduled one (a
        refused decoding raises here, before any request)."""
        self.own = self.decoding  # the engine's own decoding (entries without one)
        self.lanes: dict[str, Lane] = {}
        if self.schedule is None or not self.mode.spec.drafts:
            return
        if head is not None and self.drafter_factory is None:
            batch_schedule.check(self.schedule, find_head_spec(head))
        self.lanes = batch_schedule.lanes(self.schedule, self.own, Lane(
            self.mode, self.controller, self.current_k), self.new_controller)

    def _use_lane(self, name: str) -> None:
        """Make decoding ``name`` the engine's (mode, controller, K) until the next switch."""
        now = self.decoding
        if name == now:
            return
        lane = self.lanes[now]
        lane.current_k, lane.cap = self.current_k, self._cap
        lane = self.lanes[name]
        self.mode, self.controller, self.current_k, self._cap = (
            lane.mode, lane.controller, lane.current_k, lane.cap)

    def scheduled_k(self, running: int) -> int | None:
        """The schedule's K for ``running`` rows (None without a schedule or a head)."""
        if self.schedule is None or not self.mode.spec.drafts:
            return None
        return batch_schedule.step_for(self.schedule, running)[1]

    def _step_k(self, running: int) -> int:
        """The K of the next step (0: plain), its decoding made the engine's."""
        if self.schedule is not None and self.lanes:
            self._use_lane(batch_schedule.step_for(self.schedule, running)[2] or self.own)
        cap = self.scheduled_k(running)
        if cap is not None and self.k_limit is not None:
            cap = min(cap, self.k_limit)  # a block head drafts block_size - 1 at most
        if cap is None:
            return self.current_k if self.mode.spec.drafts else 0
        if self.controller is None:
            return cap
        if cap != self._cap:  # a new load level: start from its measured best K
            self.current_k = max(cap, self.controller.k_min)
        self._cap = cap
        return min(self.current_k, cap)

    def _commit_head(self, drafter: HeadDrafter, tokens: list[int], out: StepOutput) -> None:
        """A prompt admitted in ``step`` defers its head prefill to the step's drafting
        (``_catch_up``, batched with the other rows behind), so its first token goes out
        (``on_admitted``) after the target's prefill alone; while the schedule is off at the
        batch's load it waits until drafting resumes, and costs nothing if it never does."""
        if self._admitting and batch_draft.own(drafter):
            drafter.defer(tokens, drafter.inputs(out, slice(None)))
        else:
            super()._commit_head(drafter, tokens, out)

    def _catch_up(self, reqs: list[_Request]) -> None:
        """Run the slots that plain steps deferred through the head (batched where the rows
        allow), so that every row drafts from its whole context."""
        behind = [d for d in (r.drafter for r in reqs) if d is not None and batch_draft.own(d)
                  and d.backlog]
        if not behind:
            return
        work = [(d, d.take_backlog()) for d in behind]
        self._extend_rows([(d, *w) for d, w in work])  # type: ignore[misc]

    # ---- joining and leaving -------------------------------------------------------------
    def _admit(self) -> list[Event]:
        self._admitting = True
        try:
            return self._admit_waiting()
        finally:
            self._admitting = False

    def _admit_waiting(self) -> list[Event]:
        events: list[Event] = []
        while self.waiting and len(self.active) < self.max_num_seqs:
            slot, prompt = self.waiting.popleft()
            slot.started = time.perf_counter()
            req = slot.req
            if req.max_new <= 0:
                events.append((slot.rid, [], True))
                self._close(slot)
                continue
            events.append((slot.rid, self._prefill(req, prompt), req.done))
            if req.done:
                self._close(slot)
                continue
            if self.kv is None:
                aux = req.drafter.aux_layer_ids if req.drafter is not None else []
                self.kv = BatchKV(self.model, aux, self.compact_slack, self.direct)
            self.kv.add(req.runner.dynamic_cache(), req.runner.length)
            req.runner.reset()  # the prompt's KV now lives in the batch
            self.active.append(slot)
        return events

    def _retire(self, rows: list[int]) -> None:
        if not rows:
            return
        assert self.kv is not None
        self.kv.remove(rows)
        for b in rows:
            self._close(self.active[b])
        self.active = [s for b, s in enumerate(self.active) if b not in set(rows)]

    def _close(self, slot: _Slot) -> None:
        slot.req.done = True
        slot.req.stats.elapsed_seconds = time.perf_counter() - slot.started
        self.stats.merge(slot.req.stats)
        self.request_stats = slot.req.stats

    # ---- drafting and verification ---------------------------------------------------------
    def _plans(self, k: int) -> list[_Plan]:
        """Every active row's plan: chain / parallel drafts in batched head forwards when all
        rows draft with one head (models/decode/batch_draft.py), else row by row."""
        reqs = [s.req for s in self.active]
        if k == 0 and self.mode.spec.drafts:  # a plain step: no drafts
            one = torch.ones(1, 1, dtype=torch.bool)
            return [_Plan([r.pending], [0], one, 0, [], None) if r.drafter is not None
                    else self._plan(r, 0) for r in reqs]
        self._catch_up(reqs)
        drafters = [r.drafter for r in reqs]
        mode = self.mode.spec
        batched = self.batched_drafting and mode.drafts and not mode.tree
        if not batched or not batch_draft.batchable(drafters):
            return [self._plan(r, k) for r in reqs]
        t0 = time.perf_counter()
        rows = batch_draft.draft_rows(mode, [d for d in drafters if d is not None], k,
                                      [r.params for r in reqs], [r.gen for r in reqs])
        draft_s = time.perf_counter() - t0  # the batch's drafting time, as verify_s below
        causal = torch.ones(k + 1, k + 1, dtype=torch.bool).tril()
        return [_Plan([r.pending, *drafts], list(range(k + 1)), causal, k, drafts, q,
                      draft_s=draft_s) for r, (drafts, q) in zip(reqs, rows, strict=True)]

    def _finish_round(self, req: _Request, drafter: HeadDrafter, new: list[int],
                      out: StepOutput, rows: list[int]) -> list[int]:
        """As the batch-1 engine, but inside a batched step the head slots are committed
        for all rows together after verification (``_extend_deferred``)."""
        if batch_draft.own(drafter) and self.last_k == 0 and self._deferred is not None:
            emitted = self._emit(req, new)  # a plain step: the head catches up when it drafts
            if not req.done:
                drafter.defer(new, drafter.inputs(out, rows))
            return emitted
        if self._deferred is None or not self.batched_drafting or not batch_draft.own(drafter):
            return super()._finish_round(req, drafter, new, out, rows)
        emitted = self._emit(req, new)
        if not req.done:
            self._deferred.append((drafter, new, drafter.features(out, rows)))
        return emitted

    def _extend_rows(self, items: list[tuple[HeadDrafter, list[int], torch.Tensor]]) -> None:
        """Commit (drafter, tokens, features) of several rows: one batched head forward
        where the rows allow (batch_draft.extend_rows)."""
        drafters = [d for d, _, _ in items]
        if batch_draft.batchable(drafters):
            batch_draft.extend_rows(self.mode.spec, drafters, [t for _, t, _ in items],
                                    [f for _, _, f in items])
            return
        for drafter, tokens, feats in items:
            drafter.extend(tokens, feats)

    def _plan(self, req: _Request, k: int) -> _Plan:
        drafter = req.drafter
        if drafter is None:
            return _Plan([req.pending], [0], torch.ones(1, 1, dtype=torch.bool))
        t0 = time.perf_counter()
        if self.mode.spec.tree:
            tree = build_tree(drafter, req.pending, k, self.topk, self._tree_size(k))
            return _Plan(tree.tokens, tree.depths, tree.mask, k, tree=tree,
                         draft_s=time.perf_counter() - t0)
        drafts, q = draft_sequence(drafter, self.mode.spec, k, req.params, req.gen)
        n = len(drafts) + 1
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        return _Plan([req.pending, *drafts], list(range(n)), causal, k, drafts, q,
                     draft_s=time.perf_counter() - t0)

    def _verify(
        self, req: _Request, plan: _Plan, out: StepOutput, verify_s: float
    ) -> tuple[list[int], list[int]]:
        """(emitted tokens, kept indices into the row's new tokens), as the batch-1 rounds."""
        req.stats.num_target_forwards += 1
        drafter = req.drafter
        if drafter is None:
            return self._emit(req, [self._pick(req, out.logits[0])]), [0]
        if plan.tree is not None:
            tree = plan.tree
            if req.params.greedy:
                path, nxt = walk_greedy(tree, out.logits)
            else:
                path, nxt = walk_sampling(tree, target_probs(out.logits, req.params), req.gen)
            rows = accepted_path(tree, path)
            self._account(req, plan.k, len(path), plan.draft_s, verify_s, len(tree.tokens))
            req.stats.num_draft_tokens += len(tree.tokens) - 1 - plan.k
            new = [tree.tokens[i] for i in rows[1:]] + [nxt]
            return self._finish_round(req, drafter, new, out, rows), rows
        drafts = plan.drafts or []
        if req.params.greedy:
            accepted, nxt = verify_greedy(out.logits, drafts)
        else:
            p = target_probs(out.logits, req.params)
            accepted, nxt = verify_rejection(p, drafts, plan.q, req.gen)
        kept = list(range(accepted + 1))
        self._account(req, plan.k, accepted, plan.draft_s, verify_s, len(plan.tokens))
        new = drafts[:accepted] + [nxt]
        return self._finish_round(req, drafter, new, out, kept), kept

