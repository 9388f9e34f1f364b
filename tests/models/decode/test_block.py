"""Block mode (DFlash heads): the drafter's context cache (append, crop, batched), its drafts
against the head's own from-scratch forward, partial acceptance with the real head's forward,
adaptive block length, the block-size cap and the mode/head checks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

from eaglenest.models.decode import SpeculativeEngine
from eaglenest.models.decode.adaptive import AdaptiveDepth
from eaglenest.models.decode.batch import BatchEngine
from eaglenest.models.decode.block import BlockDrafter, ContextCache, draft_batch
from eaglenest.models.decode.modes import DecodeMode, refusal
from eaglenest.models.decode.runner import TargetRunner
from eaglenest.models.decode.sampling import SamplingParams
from eaglenest.models.heads.registry import HEADS, head_spec
from eaglenest.models.training.config import TrainConfig
from tests.models.decode.test_engine_lossless import FAST_ARCHS, PROMPTS

GREEDY = SamplingParams(0.0, 1.0)


def _kv(layers: int, start: int, m: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer keys/values [1, 2, m, 3] whose value at column c is layer * 100 + start + c."""
    col = torch.arange(start, start + m, dtype=torch.float)[None, None, :, None]
    return [((col + 100 * i).expand(1, 2, m, 3).clone(), -(col + 100 * i).expand(1, 2, m, 3))
            for i in range(layers)]


def test_context_cache_appends_grows_and_crops() -> None:
    cache = ContextCache()
    cache.append(_kv(2, 0, 3))
    first = cache.capacity
    cache.append(_kv(2, 3, first))  # past the capacity: the buffers grow, columns kept
    assert cache.length == 3 + first and cache.capacity >= cache.length
    keys, values = cache.layers()[1]
    assert keys.shape == (1, 2, 3 + first, 3)
    assert keys[0, 0, :, 0].tolist() == [100.0 + c for c in range(3 + first)]
    assert torch.equal(values, -keys)
    cache.crop(4)  # a rejected suffix: the next append writes from column 4
    cache.append(_kv(2, 40, 2))
    assert cache.layers()[0][0][0, 1, :, 2].tolist() == [0.0, 1.0, 2.0, 3.0, 40.0, 41.0]
    with pytest.raises(ValueError):
        cache.crop(7)


def _full_vocab_head(target: Any, samples: Any, block_size: int = 6) -> nn.Module:
    """A random two-layer DFlash head over the target's whole vocabulary (every target
    token can be drafted: the steered drafts below reach any token)."""
    torch.manual_seed(1)
    cfg = TrainConfig(head="dflash", draft_vocab_size=target.vocab_size, dflash_layers=2,
                      dflash_block_size=block_size)
    return HEADS["dflash"].build(target, samples, cfg).eval()


@pytest.fixture(scope="module")
def block_head(llama, samples) -> nn.Module:  # noqa: ANN001
    return _full_vocab_head(llama, samples)


def _reference_ctx(target: Any, head: nn.Module, seq: list[int]) -> list[Any]:
    """The context K/V of positions 0..len(seq)-1, from an uncached target forward."""
    runner = TargetRunner(target.model, head.cfg.aux_layer_ids, direct=False)
    aux = runner.forward(seq).aux  # [n, n_aux * h]
    assert aux is not None
    return head.context_kv(aux[None], torch.arange(len(seq))[None])


def _assert_cache_exact(target: Any, head: nn.Module, d: BlockDrafter, seq: list[int]) -> None:
    """The drafter holds exactly positions 0..n-1 of ``seq`` (n = its committed slots) and
    its anchor is seq[n]."""
    n = d.slots
    assert d.ctx.length == n and d.anchor == seq[n]
    for (k, v), (rk, rv) in zip(d.ctx.layers(), _reference_ctx(target, head, seq[:n]),
                                strict=True):
        torch.testing.assert_close(k, rk, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(v, rv, atol=1e-4, rtol=1e-4)


def _steered(head: nn.Module, truths: list[list[int]], wrong: Callable[[int], bool]) -> Callable:
    """Wrap ``head.draft_block``: the real forward runs (on the drafters' caches), then each
    row's slot j is made to draft the true token seq[n + j] of the row's sequence (found by
    its anchor seq[n]), except where ``wrong(n + j)``: there the forward's own argmax stays
    (a random head's: almost surely wrong)."""
    real = head.draft_block
    draft_id = {int(t): i for i, t in enumerate(head.target_id_order())}

    def steered(anchor, position, ctx, block_len, ctx_mask=None):  # noqa: ANN001, ANN202
        logits = real(anchor, position, ctx, block_len, ctx_mask).clone()
        for b in range(anchor.shape[0]):
            n = int(position[b])
            seq = next(t for t in truths if len(t) > n and t[n] == int(anchor[b, 0]))
            for j in range(1, block_len):
                if n + j < len(seq) and not wrong(n + j):
                    logits[b, j - 1, draft_id[seq[n + j]]] = 1e4
        return logits

    return steered


def _steered_run(engine: BatchEngine, head: nn.Module, target: Any, prompts: list[list[int]],
                 n: int) -> Iterator[list[list[int]]]:
    """Decode ``prompts`` together, checking every row's cache after every step; yields
    the outputs at the end."""
    ids = [engine.submit(p, n) for p in prompts]
    outs: dict[int, list[int]] = {rid: [] for rid in ids}
    while engine.has_work:
        for rid, new, _ in engine.step():
            outs[rid].extend(new)
        for slot in engine.active:
            drafter = slot.req.drafter
            assert isinstance(drafter, BlockDrafter)
            seq = prompts[ids.index(slot.rid)] + outs[slot.rid]
            _assert_cache_exact(target, head, drafter, seq)
    yield [outs[rid] for rid in ids]


@pytest.mark.parametrize("rows", [1, 3])
def test_partial_acceptance_keeps_the_cache_exact(rows, llama, block_head) -> None:  # noqa: ANN001
    """Drafts steered to the true continuation except at some positions: rounds accept 0..K
    drafts; after every step each row's cache equals the context recomputed from scratch
    (rejected drafts never enter it) and the output is the target's greedy output. One row
    runs the per-request drafter; three rows the batched block forward and context commit."""
    prompts = [PROMPTS[0], PROMPTS[3], PROMPTS[1]][:rows]
    plain = SpeculativeEngine(llama, None)
    bases = [plain.generate_ids(p, 40) for p in prompts]
    # one true continuation per prompt: positions index prompt + base
    truths = [p + b for p, b in zip(prompts, bases, strict=True)]
    engine = BatchEngine(llama, block_head, "block", k=4, max_num_seqs=rows)
    head = engine.head  # the engine's copy (its linears are the chosen kernels)
    assert head is not None
    head.draft_block = _steered(head, truths, lambda i: i % 7 in (3, 5))  # type: ignore[method-assign]
    try:
        (outs,) = list(_steered_run(engine, head, llama, prompts, 40))
    finally:
        del head.draft_block
    assert outs == bases
    st = engine.stats
    assert 0 < st.num_accepted_tokens < st.num_draft_tokens
    assert st.accepted_per_pos[0] > st.accepted_per_pos[-1] > 0


def test_cached_and_batched_drafts_equal_the_heads_own_forward(llama, block_head) -> None:  # noqa: ANN001
    """After a few rounds, each request's block logits from its cache equal the head's
    from-scratch ``draft`` over the whole context; the batched forward over padded
    contexts gives every row the same drafts as its own forward."""
    engine = BatchEngine(llama, block_head, "block", k=5, max_num_seqs=3)
    for p in (PROMPTS[0], PROMPTS[3], PROMPTS[1]):
        engine.submit(p, 30)
    outs: dict[int, list[int]] = {}
    for _ in range(4):
        for rid, new, _ in engine.step():
            outs.setdefault(rid, []).extend(new)
    drafters = [s.req.drafter for s in engine.active]
    assert len(drafters) == 3 and all(isinstance(d, BlockDrafter) for d in drafters)
    prompts = {0: PROMPTS[0], 1: PROMPTS[3], 2: PROMPTS[1]}
    own = []
    for slot in engine.active:
        d = slot.req.drafter
        assert isinstance(d, BlockDrafter)
        seq = prompts[slot.rid] + outs[slot.rid]
        runner = TargetRunner(llama.model, block_head.cfg.aux_layer_ids, direct=False)
        aux = runner.forward(seq[: d.slots]).aux
        assert aux is not None
        scratch = block_head.draft(torch.tensor([seq[: d.slots + 1]]), aux[None], 5)
        drafts, _ = d.draft_block(5, GREEDY, None)
        assert drafts == scratch.tolist()
        own.append(drafts)
    batched = draft_batch(drafters, 5, [GREEDY] * 3, [None] * 3)  # type: ignore[arg-type]
    assert [b for b, _ in batched] == own
    assert len({d.slots for d in drafters}) > 1  # the rows' contexts differ in length


def test_block_k_is_capped_at_the_heads_block_size(llama, block_head) -> None:  # noqa: ANN001
    """block_size 6 -> at most 5 drafts a round, fixed or adaptive."""
    engine = SpeculativeEngine(llama, block_head, "block", k=9)
    assert engine.k == 5 and "block_size" in engine.note
    adaptive = SpeculativeEngine(llama, block_head, "block", k=3, adaptive=True)
    assert adaptive.controller is not None and adaptive.controller.k_max == 5
    assert adaptive.controller.block and adaptive.controller.k_min == 0
    base = SpeculativeEngine(llama, None).generate_ids(PROMPTS[0], 20)
    assert adaptive.generate_ids(PROMPTS[0], 20) == base
    assert engine.generate_ids(PROMPTS[0], 20) == base
    assert engine.stats.num_draft_tokens == 5 * engine.stats.num_drafts > 0
    scheduled = BatchEngine(llama, block_head, "block", k=3, schedule=[(1, 9), (8, 2)])
    assert scheduled._step_k(1) == 5 and scheduled._step_k(4) == 2


def test_adaptive_block_length_counts_one_forward_and_runs_deep() -> None:
    """A block round runs one head forward for any K >= 1 (none for K = 0): with the same
    acceptance and costs a block round runs at least as deep as a parallel one and deeper
    than a chain; poor acceptance brings it down to short blocks or plain rounds."""
    block = AdaptiveDepth(k_min=0, k_max=15, block=True)
    assert [block.forwards(k) for k in (0, 1, 2, 15)] == [0, 1, 1, 1]

    def best(accepted: list[int], **kw: Any) -> int:
        ctl = AdaptiveDepth(k_min=0, k_max=15, slope=0.02, prior_weight=1e-9, **kw)
        for a in accepted * 7:  # rounds of 15 drafts: a_j falls with the position
            ctl.update(15, a, draft_seconds=0.01 * ctl.forwards(15),
                       verify_seconds=0.1 * (1 + 0.02 * 15), size=16)
        return ctl.choose(lambda k: k + 1)

    falling = [1, 2, 3, 4, 5, 6, 8, 10, 15]
    chain, parallel, deep = best(falling), best(falling, parallel=True), best(falling, block=True)
    assert deep >= parallel and deep > chain and deep >= 8, (chain, parallel, deep)
    assert best([0], block=True) == 0  # nothing accepted: plain rounds


def test_mode_and_head_checks(llama, block_head, make_head) -> None:  # noqa: ANN001
    """A block mode needs a block head and a block head drafts in block mode only: the
    engine refuses either mismatch, naming the head and the mode."""
    eagle3 = make_head(llama, "eagle3")
    with pytest.raises(ValueError, match="block-drafting head.*EAGLE-3"):
        SpeculativeEngine(llama, eagle3, DecodeMode.BLOCK)
    for mode in ("chain", "tree"):
        with pytest.raises(ValueError, match=f"DFlash heads draft a block.*{mode}.*block"):
            SpeculativeEngine(llama, block_head, mode)
    with pytest.raises(ValueError, match="parallel drafting needs a head with mask slots.*DFlash"):
        SpeculativeEngine(llama, block_head, "parallel")
    spec = head_spec(block_head)
    assert spec.default_mode is DecodeMode.BLOCK and refusal(DecodeMode.BLOCK, spec) is None
    assert refusal(DecodeMode.PLAIN, spec) is None
    assert SpeculativeEngine(llama, None, "block").mode is DecodeMode.PLAIN


def test_sampling_in_a_batch_follows_each_request_seed(llama, block_head) -> None:  # noqa: ANN001
    """Block drafts with temperature: each request's output is its batch-1 output under its
    seed (the batched block forward draws from each row's own generator)."""
    jobs = [(p, 12, {"temperature": 0.8, "top_p": 0.9, "seed": i})
            for i, p in enumerate([PROMPTS[0], PROMPTS[3], PROMPTS[1]])]
    single = SpeculativeEngine(llama, block_head, "block", k=4)
    expect = [single.generate_ids(p, n, **kw) for p, n, kw in jobs]
    engine = BatchEngine(llama, block_head, "block", k=4)
    ids = [engine.submit(p, n, **kw) for p, n, kw in jobs]
    outs: dict[int, list[int]] = {rid: [] for rid in ids}
    while engine.has_work:
        for rid, new, _ in engine.step():
            outs[rid].extend(new)
    assert [outs[rid] for rid in ids] == expect
    assert engine.stats.num_drafts == single.stats.num_drafts > 0


@pytest.mark.parametrize("arch", FAST_ARCHS)
def test_steered_block_lossless_every_arch(arch, tiny_target, samples) -> None:  # noqa: ANN001
    """Every architecture, one request and a batch of two: drafts partly right (the real
    head's forward, steered), output equal to the target's greedy output."""
    target = tiny_target(arch)
    prompts = [PROMPTS[0], PROMPTS[3]]
    plain = SpeculativeEngine(target, None)
    bases = [plain.generate_ids(p, 20) for p in prompts]
    truths = [p + b for p, b in zip(prompts, bases, strict=True)]
    head = _full_vocab_head(target, samples)
    wrong = lambda i: i % 5 == 2  # noqa: E731
    single = SpeculativeEngine(target, head, "block", k=4)
    batched = BatchEngine(target, head, "block", k=4)
    for engine in (single, batched):
        assert engine.head is not None
        engine.head.draft_block = _steered(engine.head, truths, wrong)  # type: ignore[method-assign]
    assert [single.generate_ids(p, 20) for p in prompts] == bases
    assert batched.generate_batch(prompts, 20) == bases
    for st in (single.stats, batched.stats):
        assert 0 < st.num_accepted_tokens < st.num_draft_tokens
