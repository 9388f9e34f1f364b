"""A BatchEngine that follows a speculation schedule: each step drafts the K that the
schedule gives for the rows in the batch (0 = a plain step), the output stays the plain
decoder's token for token, and the head slots that plain steps defer catch up exactly."""

from __future__ import annotations

import pytest
import torch

from eaglenest.models.decode import SpeculativeEngine, batch_draft
from eaglenest.models.decode.batch import BatchEngine
from eaglenest.models.decode.drafter import HeadDrafter
from eaglenest.models.decode.runner import TargetRunner
from tests.models.decode.test_batch import PROMPTS, staggered

LENGTHS = [16, 6, 3, 20, 10]
SCHEDULE = [(1, 3), (2, 2), (64, 0)]  # K=3 alone, K=2 in pairs, plain from 3 rows on


def _prefill(target, head, prompt):  # noqa: ANN001, ANN202
    drafter = HeadDrafter(head)
    runner = TargetRunner(target.model, drafter.aux_layer_ids)
    step = runner.forward(prompt)
    first = int(step.logits[-1].argmax())
    return drafter, prompt[1:] + [first], drafter.inputs(step, slice(None))


def _state(d: HeadDrafter) -> list[torch.Tensor]:
    assert d.past is not None and d.last_logits is not None and d.last_out is not None
    return [d.past[0], d.past[1], d.last_logits, d.last_out]


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "peagle"])
def test_deferred_slots_catch_up_to_step_by_step_extension(kind, llama, make_head) -> None:  # noqa: ANN001
    head = make_head(llama, kind)
    chunks = [[11, 12], [13], [14, 15, 16]]
    rows = []
    for prompt in (PROMPTS[0], PROMPTS[3]):
        step_by_step, tokens, inputs = _prefill(llama, head, prompt)
        step_by_step.extend(tokens, step_by_step.combine(inputs))
        deferred = HeadDrafter(head)
        deferred.defer(tokens, inputs)  # combined only when taken
        for chunk in chunks:  # stand-in inputs: any [m, in] rows do
            f = torch.randn(len(chunk), inputs.shape[1], generator=torch.Generator().manual_seed(len(chunk)))
            step_by_step.extend(chunk, step_by_step.combine(f))
            deferred.defer(chunk, f)
        assert deferred.past is None and len(deferred.backlog) == 4
        deferred.extend(*deferred.take_backlog())  # type: ignore[misc]
        assert deferred.backlog == [] and deferred.slots == step_by_step.slots
        for a, b in zip(_state(deferred), _state(step_by_step), strict=True):
            assert torch.allclose(a, b, atol=1e-5)
        rows.append((deferred, step_by_step))
    # two rows behind by different amounts catch up in one batched forward
    for deferred, _ in rows:
        deferred.defer([21, 22, 23][: 1 + len(rows)], torch.randn(1 + len(rows), inputs.shape[1]))
    behind = [d for d, _ in rows]
    work = [d.take_backlog() for d in behind]
    batch_draft.extend(behind, [w[0] for w in work], [w[1] for w in work])  # type: ignore[index]
    for d, (tokens, f) in zip((s for _, s in rows), work, strict=True):  # type: ignore[misc]
        d.extend(tokens, f)
    for (a, b) in rows:
        for x, y in zip(_state(a), _state(b), strict=True):
            assert torch.allclose(x, y, atol=1e-5)


@pytest.mark.parametrize(("kind", "mode", "adaptive"), [
    ("eagle3", "chain", False), ("eagle3", "chain", True), ("eagle", "tree", False),
    ("peagle", "parallel", False)])
def test_schedule_sets_k_per_step_by_rows_running(kind, mode, adaptive, llama, make_head) -> None:  # noqa: ANN001
    head = make_head(llama, kind)
    jobs = [(p, n, {}) for p, n in zip(PROMPTS, LENGTHS, strict=True)]
    expect = [SpeculativeEngine(llama, None).generate_ids(p, n) for p, n, _ in jobs]
    engine = BatchEngine(llama, head, mode, k=3, depth=3, topk=2, total_tokens=7,
                         adaptive=adaptive, max_num_seqs=4, schedule=SCHEDULE)
    seen: list[tuple[int, int]] = []
    step_k = engine._step_k

    def record(running: int) -> int:
        k = step_k(running)
        seen.append((running, k))
        return k

    engine._step_k = record  # type: ignore[method-assign]
    assert staggered(engine, jobs, every=2) == expect  # lossless whatever K each step used
    cap = {1: 3, 2: 2}
    assert {r for r, _ in seen} >= {1, 2, 3}
    for running, k in seen:
        if adaptive:
            assert k <= cap.get(running, 0), (running, k)
        else:
            assert k == cap.get(running, 0), (running, k)
    assert engine.rounds_by_k.get(0, 0) == sum(1 for _, k in seen if k == 0) > 0
    assert sum(engine.rounds_by_k.values()) == len(seen)
    assert not any(r.drafter is not None and r.drafter.backlog for r in
                   (s.req for s in engine.active))


def test_prompts_admitted_together_defer_by_the_load_they_make(llama, make_head) -> None:  # noqa: ANN001
    """Three prompts joining an empty batch in one step make 3 rows, where the schedule is off:
    none of them runs its prompt through the head (the first one alone would be at load 1,
    where the schedule drafts); the output is still the plain decoder's."""
    head = make_head(llama, "eagle3")
    engine = BatchEngine(llama, head, "chain", k=3, max_num_seqs=4, schedule=[(1, 3), (8, 0)])
    ids = [engine.submit(p, 6) for p in PROMPTS[:3]]
    outs: dict[int, list[int]] = {rid: [] for rid in ids}
    for rid, new, _ in engine.step():
        outs[rid].extend(new)
    drafters = [s.req.drafter for s in engine.active]
    assert len(drafters) == 3 and engine.last_k == 0
    assert all(d is not None and d.past is None and d.backlog for d in drafters)
    while engine.has_work:
        for rid, new, _ in engine.step():
            outs[rid].extend(new)
    plain = SpeculativeEngine(llama, None)
    assert [outs[rid] for rid in ids] == [plain.generate_ids(p, 6) for p in PROMPTS[:3]]


def test_first_token_goes_out_before_the_head_prefill(llama, make_head) -> None:  # noqa: ANN001
    """At a load where the schedule drafts, a prompt's first token reaches ``on_admitted``
    before its prompt has run through the head; the step's drafting runs it (so the head has
    the whole prompt when it drafts), and the output is the plain decoder's."""
    head = make_head(llama, "eagle3")
    engine = BatchEngine(llama, head, "chain", k=3, max_num_seqs=4, schedule=[(4, 3)])
    rid = engine.submit(PROMPTS[0], 8)
    seen: list[tuple[int, int]] = []
    out: list[int] = []

    def on_admitted(events: list[tuple[int, list[int], bool]]) -> None:
        drafter = engine.active[0].req.drafter
        assert drafter is not None and drafter.past is None and drafter.slots == 0
        seen.append((events[0][0], len(drafter.backlog)))
        out.extend(events[0][1])  # the first token, sent before the step's forward

    out += [t for _, new, _ in engine.step(on_admitted) for t in new]
    assert seen == [(rid, 1)] and engine.last_k == 3
    drafter = engine.active[0].req.drafter  # at most 1 + 4 of 8 tokens: still running
    assert drafter is not None and drafter.backlog == [] and drafter.slots >= len(PROMPTS[0])
    while engine.has_work:
        out += [t for _, new, _ in engine.step(on_admitted) for t in new]
    plain = SpeculativeEngine(llama, None)
    assert out == plain.generate_ids(PROMPTS[0], 8)


# one row: a tree; two: chain; three: parallel; more: plain
DECODINGS = [(1, 3, "tree"), (2, 2, "chain"), (3, 3, "parallel"), (64, 0)]


@pytest.mark.parametrize("adaptive", ["", "+adaptive"])
def test_decoding_switches_between_steps_on_one_head_state(adaptive, llama, make_head) -> None:  # noqa: ANN001
    """Tree, chain and parallel steps draft from the same HeadDrafter state one after the
    other as the load changes: the greedy output is still the plain decoder's, and every
    decoding ran (counted per step, "plain" for K = 0)."""
    head = make_head(llama, "peagle")  # mask slots: it drafts chain, tree and parallel
    schedule = [(m, k, f"{d}{adaptive}") if d else (m, k) for m, k, *rest in DECODINGS
                for d in [rest[0] if rest else None]]
    jobs: list[tuple[list[int], int, dict]] = [(p, n, {}) for p, n in zip(PROMPTS, LENGTHS, strict=True)]
    expect = [SpeculativeEngine(llama, None).generate_ids(p, n) for p, n, _ in jobs]
    engine = BatchEngine(llama, head, "chain", k=3, depth=3, topk=2, total_tokens=7,
                         max_num_seqs=4, schedule=schedule)  # type: ignore[arg-type]
    seen: list[tuple[int, str, int]] = []
    step_k = engine._step_k

    def record(running: int) -> int:
        assert engine.kv is not None  # every row's head holds (or owes) one slot per token
        for slot, length in zip(engine.active, engine.kv.lengths, strict=True):
            d = slot.req.drafter
            assert d is not None and d.slots + sum(len(t) for t, _ in d.backlog) == length
        k = step_k(running)
        seen.append((running, engine.decoding, k))
        return k

    engine._step_k = record  # type: ignore[method-assign]
    assert staggered(engine, jobs, every=1) == expect  # 1, 2, 3 and 4 rows run
    names = {1: f"tree{adaptive}", 2: f"chain{adaptive}", 3: f"parallel{adaptive}"}
    for running, decoding, k in seen:
        assert decoding == names.get(running, "chain"), (running, decoding)  # own beyond 3
        assert k <= 3 if running <= 3 else k == 0
    ran = {decoding for running, decoding, k in seen if k > 0}
    assert ran == set(names.values())
    assert sum(engine.steps_by_decoding.values()) == len(seen)
    assert engine.steps_by_decoding["plain"] == sum(1 for *_, k in seen if k == 0) > 0
    if adaptive:  # one controller per decoding, each its own mode's
        lanes = {n: engine.lanes[n].controller for n in names.values()}
        assert all(c is not None for c in lanes.values())
        assert len({id(c) for c in lanes.values()}) == 3
        assert lanes[f"tree{adaptive}"].k_min == 1 and lanes[f"parallel{adaptive}"].parallel  # type: ignore[union-attr]


@pytest.mark.parametrize(("kind", "schedule", "message"), [
    ("eagle3", [(1, 3, "parallel"), (8, 2)],
     "the speculation schedule's decoding 'parallel' does not suit the head: parallel "
     "drafting needs a head with mask slots (HeadSpec.parallel); EAGLE-3 heads have none"),
    ("eagle3", [(1, 3, "beam")], "unknown decoding 'beam'; valid: chain, chain+adaptive, "
     "tree, tree+adaptive, parallel, parallel+adaptive, block, block+adaptive"),
])
def test_a_scheduled_decoding_the_head_cannot_run_is_refused(kind, schedule, message, llama,  # noqa: ANN001
                                                             make_head) -> None:  # noqa: ANN001
    with pytest.raises(ValueError) as exc:
        BatchEngine(llama, make_head(llama, kind), "chain", k=3, schedule=schedule)
    assert str(exc.value) == message
