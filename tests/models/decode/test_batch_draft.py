"""Batched drafting (models/decode/batch_draft.py): rows of different lengths drafted in one
head forward per step give each row what its own batch-1 HeadDrafter gives."""

from __future__ import annotations

import pytest
import torch

from eaglenest.models.decode import batch_draft
from eaglenest.models.decode.batch import BatchEngine
from eaglenest.models.decode.drafter import HeadDrafter
from eaglenest.models.decode.runner import TargetRunner
from eaglenest.models.decode.sampling import SamplingParams

PROMPTS = [[5, 17, 33, 80, 9, 100], [1, 42], list(range(60, 90))]  # 6, 2 and 30 slots


def _drafters(target, head) -> list[HeadDrafter]:  # noqa: ANN001
    """One prefilled drafter per prompt (slots = prompt length), as the engine's prefill."""
    out = []
    for prompt in PROMPTS:
        drafter = HeadDrafter(head)
        runner = TargetRunner(target.model, drafter.aux_layer_ids)
        step = runner.forward(prompt)
        first = int(step.logits[-1].argmax())
        drafter.extend(prompt[1:] + [first], drafter.features(step, slice(None)))
        out.append(drafter)
    return out


def _snapshot(d: HeadDrafter) -> tuple:
    assert d.past is not None and d.last_logits is not None and d.last_out is not None
    return d.slots, d.past[0].clone(), d.past[1].clone(), d.last_logits.clone(), d.last_out.clone()


@pytest.mark.parametrize(("kind", "draft"), [("eagle", "draft_chain"), ("eagle3", "draft_chain"),
                                             ("peagle", "draft_parallel"),
                                             ("eagle3@2", "draft_chain"),
                                             ("peagle@3", "draft_parallel")])
def test_batched_drafts_equal_each_rows_own(kind, draft, llama, make_head) -> None:  # noqa: ANN001
    head = make_head(llama, kind)
    greedy = SamplingParams(0.0, 1.0)
    batched, single = _drafters(llama, head), _drafters(llama, head)
    assert batch_draft.batchable(batched)
    got = getattr(batch_draft, draft)(batched, 4, [greedy] * 3, [None] * 3)
    want = [getattr(d, draft)(4, greedy, None) for d in single]
    assert [g[0] for g in got] == [w[0] for w in want]
    assert all(len(g[0]) == 4 and g[1] is None for g in got)
    # drafting left every row's committed cache as it was
    for a, b in zip(batched, single, strict=True):
        a.crop()
        b.crop()
        sa, sb = _snapshot(a), _snapshot(b)
        assert sa[0] == sb[0] and all(torch.allclose(x, y, atol=1e-5) for x, y in zip(sa[1:], sb[1:], strict=True))


def test_batched_sampled_drafts_follow_each_rows_generator(llama, make_head) -> None:  # noqa: ANN001
    head = make_head(llama, "eagle3")
    params = [SamplingParams(0.8, 0.9)] * 3
    gens_a = [torch.Generator().manual_seed(i) for i in range(3)]
    gens_b = [torch.Generator().manual_seed(i) for i in range(3)]
    got = batch_draft.draft_chain(_drafters(llama, head), 3, params, gens_a)
    want = [d.draft_chain(3, p, g) for d, p, g in zip(_drafters(llama, head), params, gens_b,
                                                       strict=True)]
    for (ga, qa), (wa, qw) in zip(got, want, strict=True):
        assert ga == wa
        assert qa is not None and qw is not None and qa.shape == (3, llama.model.config.vocab_size)
        assert torch.allclose(qa, qw, atol=1e-5)


def test_batched_extend_commits_each_row_like_its_own_extend(llama, make_head) -> None:  # noqa: ANN001
    head = make_head(llama, "eagle3")
    batched, single = _drafters(llama, head), _drafters(llama, head)
    hidden = head.cfg.hidden_size
    torch.manual_seed(0)
    tokens = [[3, 4, 5], [6], [7, 8]]  # different numbers of accepted tokens per row
    feats = [torch.randn(len(t), hidden) for t in tokens]
    batch_draft.extend(batched, tokens, feats)
    for d, t, f in zip(single, tokens, feats, strict=True):
        d.extend(t, f)
    for a, b in zip(batched, single, strict=True):
        sa, sb = _snapshot(a), _snapshot(b)
        assert sa[0] == sb[0]
        assert sa[1].shape == sb[1].shape  # no padding columns leaked into a row's cache
        assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(sa[1:], sb[1:], strict=True))


def test_not_batchable_without_a_shared_head(llama, make_head) -> None:  # noqa: ANN001
    rows = _drafters(llama, make_head(llama, "eagle3"))
    assert not batch_draft.batchable(rows[:1])  # one row: nothing to batch
    assert not batch_draft.batchable([rows[0], None])  # type: ignore[list-item]
    assert not batch_draft.batchable([rows[0], HeadDrafter(make_head(llama, "eagle3"))])


def test_engine_drafts_the_whole_batch_in_k_minus_1_head_forwards(llama, make_head) -> None:  # noqa: ANN001
    """Three chain rows, K = 4: each step costs 3 draft forwards + 1 extend, not 3 x 4."""
    head = make_head(llama, "eagle3")
    engine = BatchEngine(llama, head, "chain", k=4)
    for p in PROMPTS:
        engine.submit(p, 30)
    engine.step()  # admits (prefill: one extend per row) and runs the first batched step
    calls = []
    used = engine.head  # the engine's own (oneDNN-repacked) copy of the head
    assert used is not None
    original = used.step
    used.step = lambda *a, **kw: (calls.append(1), original(*a, **kw))[1]  # type: ignore[method-assign]
    try:
        engine.step()
    finally:
        del used.step
    assert len(engine.active) == 3 and len(calls) == 3 + 1
