"""Continuous batching: every request of a batch gets exactly its batch-1 output (fp32 greedy),
whatever its length, when it joins, when it finishes and whatever stops it."""

from __future__ import annotations

import pytest
import torch

from eaglenest.models.decode import SpeculativeEngine
from eaglenest.models.decode.batch import BatchEngine
from eaglenest.models.decode.batch_kv import BatchKV
from tests.models.decode.oracle import OracleDrafter

PROMPTS = [[5, 17, 33, 80, 9, 100], [1, 42], [7] * 12, list(range(60, 90)), [3, 9, 27]]
LENGTHS = [20, 7, 1, 26, 13]  # max_new_tokens per prompt: requests finish at different steps
MODES = [("eagle3", "chain"), ("eagle", "tree"), ("peagle", "parallel"), ("dflash", "block")]


def staggered(engine: BatchEngine, jobs: list[tuple[list[int], int, dict]], every: int = 2):
    """Submit job i after i * ``every`` steps; return each job's tokens (in job order)."""
    outs: dict[int, list[int]] = {}
    ids: list[int] = []
    steps = 0
    while len(ids) < len(jobs) or engine.has_work:
        while len(ids) < len(jobs) and steps >= len(ids) * every:
            prompt, n, kw = jobs[len(ids)]
            ids.append(engine.submit(prompt, n, **kw))
            outs[ids[-1]] = []
        for rid, new, _ in engine.step():
            outs[rid].extend(new)
        steps += 1
    return [outs[rid] for rid in ids]


def batch1(engine: SpeculativeEngine, jobs: list[tuple[list[int], int, dict]]) -> list[list[int]]:
    return [engine.generate_ids(p, n, **kw) for p, n, kw in jobs]


def test_plain_batch_equals_batch1_and_compacts(llama) -> None:  # noqa: ANN001
    jobs = [(p, n, {}) for p, n in zip(PROMPTS, LENGTHS, strict=True)]
    expect = batch1(SpeculativeEngine(llama, None), jobs)
    engine = BatchEngine(llama, None, compact_slack=0)
    assert staggered(engine, jobs, every=3) == expect
    assert engine.generate_batch(PROMPTS, 9) == [e[:9] for e in batch1(
        SpeculativeEngine(llama, None), [(p, 9, {}) for p in PROMPTS])]
    assert not engine.has_work and engine.kv is not None and engine.kv.rows == 0


@pytest.mark.parametrize(("kind", "mode"), MODES)
def test_heads_batch_equals_batch1(kind, mode, llama, make_head) -> None:  # noqa: ANN001
    head = make_head(llama, kind)
    kw = dict(k=3, depth=3, topk=3, total_tokens=10)
    jobs = [(p, n, {}) for p, n in zip(PROMPTS, LENGTHS, strict=True)]
    single = SpeculativeEngine(llama, head, mode, **kw)
    expect = batch1(single, jobs)
    engine = BatchEngine(llama, head, mode, max_num_seqs=3, compact_slack=4, **kw)
    assert staggered(engine, jobs, every=1) == expect
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos",
                 "num_emitted_tokens", "num_target_forwards"):
        assert getattr(engine.stats, name) == getattr(single.stats, name), name


def test_sliding_window_arch_batch_equals_batch1(tiny_target, make_head) -> None:  # noqa: ANN001
    target = tiny_target("GptOssForCausalLM")  # per-layer-type masks, window 16, MoE
    head = make_head(target, "eagle3")
    prompts = [PROMPTS[0], PROMPTS[3], [9] * 20]  # GPT-OSS: sliding window 16 is exceeded
    for h, mode in ((None, "plain"), (head, "chain"), (head, "tree"),
                    (make_head(target, "dflash"), "block")):
        kw = dict(k=3, depth=3, topk=2, total_tokens=7)
        expect = [SpeculativeEngine(target, h, mode, **kw).generate_ids(p, 16) for p in prompts]
        engine = BatchEngine(target, h, mode, compact_slack=2, **kw)
        assert engine.generate_batch(prompts, 16) == expect, mode


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_stop_tokens_mid_draft_in_a_batch(mode, llama) -> None:  # noqa: ANN001
    """Oracle drafts (all accepted): each request stops on its own token inside a block."""
    jobs = []
    for prompt in PROMPTS[:3]:
        base = SpeculativeEngine(llama, None).generate_ids(prompt, 40)
        jobs.append((prompt, base))
    engine = BatchEngine(llama, None, mode, k=5, depth=5, topk=2, total_tokens=11,
                         drafter_factory=lambda: None)  # replaced per request below
    submitted = []
    for cut, (prompt, base) in zip((3, 7, 12), jobs, strict=True):
        engine.drafter_factory = lambda seq=prompt + base: OracleDrafter(seq, 360)
        stop = base[cut]
        submitted.append((engine.submit(prompt, 30, stop_token_ids=[stop]),
                          base[: base.index(stop) + 1]))
    outs: dict[int, list[int]] = {rid: [] for rid, _ in submitted}
    finished = []
    while engine.has_work:
        for rid, new, done in engine.step():
            outs[rid].extend(new)
            if done:
                finished.append(rid)
    assert [outs[rid] for rid, _ in submitted] == [want for _, want in submitted]
    assert sorted(finished) == sorted(outs)
    assert engine.stats.num_accepted_tokens == engine.stats.num_draft_tokens or mode == "tree"


def test_sampling_follows_each_request_seed(llama, make_head) -> None:  # noqa: ANN001
    head = make_head(llama, "eagle3")
    jobs = [(p, 12, {"temperature": 0.8, "top_p": 0.9, "seed": i})
            for i, p in enumerate(PROMPTS[:3])]
    expect = batch1(SpeculativeEngine(llama, head, "chain", k=3), jobs)
    engine = BatchEngine(llama, head, "chain", k=3)
    assert staggered(engine, jobs, every=1) == expect


def test_queue_cancel_and_empty_requests(llama) -> None:  # noqa: ANN001
    engine = BatchEngine(llama, None, max_num_seqs=2)
    a = engine.submit(PROMPTS[0], 10)
    b = engine.submit(PROMPTS[1], 10)
    c = engine.submit(PROMPTS[2], 0)
    events = engine.step()  # prefill a and b, then one batched step (c waits)
    assert {rid for rid, _, _ in events} == {a, b} and len(engine.active) == 2
    engine.cancel(a)
    assert [s.rid for s in engine.active] == [b]
    outs: dict[int, list[int]] = {b: [t for rid, new, _ in events if rid == b for t in new],
                                  c: []}
    while engine.has_work:
        for rid, new, _ in engine.step():
            outs[rid].extend(new)
    assert outs[c] == []
    assert outs[b] == SpeculativeEngine(llama, None).generate_ids(PROMPTS[1], 10)
    with pytest.raises(ValueError):
        engine.submit([], 4)


def test_first_tokens_go_out_before_the_batched_forward(llama, make_head) -> None:  # noqa: ANN001
    """on_admitted gets each admitted request's first token before the step's target forward
    (the forward is not entered yet when it is called) and the step leaves those events
    out; every request's tokens are still exactly its batch-1 output."""
    head = make_head(llama, "eagle3")
    engine = BatchEngine(llama, head, "chain", k=3, schedule=[(1, 3), (8, 0)])
    jobs = [(p, n, {}) for p, n in zip(PROMPTS[:4], LENGTHS[:4], strict=True)]
    expect = batch1(SpeculativeEngine(llama, head, "chain", k=3), jobs)
    forwards: list[int] = []
    original = BatchKV.forward

    def counted(self, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        forwards.append(1)
        return original(self, *a, **kw)

    early: list[tuple[int, int]] = []  # (rid, forwards done when its first token came)
    outs: dict[int, list[int]] = {}

    def admitted(events):  # noqa: ANN001, ANN202
        for rid, new, _ in events:
            early.append((rid, len(forwards)))
            outs[rid] = list(new)

    ids = [engine.submit(p, n) for p, n, _ in jobs[:2]]
    BatchKV.forward = counted  # type: ignore[method-assign]
    try:
        first = engine.step(admitted)  # admits 0 and 1, then one batched forward
        assert early == [(ids[0], 0), (ids[1], 0)]
        assert len(first) == 2  # one decode event per row; the prefill tokens went early
        for rid, new, _ in first:
            outs[rid].extend(new)
        ids += [engine.submit(p, n) for p, n, _ in jobs[2:]]
        while engine.has_work:
            for rid, new, _ in engine.step(admitted):
                outs[rid].extend(new)
    finally:
        BatchKV.forward = original  # type: ignore[method-assign]
    assert [rid for rid, _ in early] == ids and early[2][1] == early[3][1] == 1
    assert [outs[rid] for rid in ids] == expect


def test_compact_gathers_valid_columns(llama) -> None:  # noqa: ANN001
    kv = BatchKV(llama.model, [])
    kv.valid = torch.tensor([[1, 0, 1, 1], [0, 1, 0, 0]], dtype=torch.bool)
    kv.key_pos = torch.tensor([[0, 9, 1, 2], [9, 0, 9, 9]])
    kv.lengths = [3, 1]

    class Layer:  # keys[b, 0, c, 0] = 10 * b + c
        keys = (torch.arange(2)[:, None] * 10 + torch.arange(4)).float()[:, None, :, None]
        values = keys.clone()

    layer = Layer()
    kv.cache = type("C", (), {"layers": [layer]})()  # type: ignore[assignment]
    kv.compact()
    assert kv.valid.tolist() == [[True, True, True], [True, False, False]]
    assert kv.key_pos.tolist() == [[0, 1, 2], [0, 9, 9]]
    assert layer.keys[:, 0, :, 0].tolist() == [[0.0, 2.0, 3.0], [11.0, 10.0, 10.0]]
