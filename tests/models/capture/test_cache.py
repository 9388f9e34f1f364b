from __future__ import annotations

import pytest
import torch

from eaglenest.models.capture.cache import CaptureCache
from eaglenest.models.training.config import TrainConfig
from eaglenest.models.training.train import TrainData, collate, train


def test_cached_capture_matches_a_live_capture(llama, samples) -> None:  # noqa: ANN001
    """Padded cached capture == each sample's own live capture on its real positions, and
    the logits recomputed from last_hidden == the live logits (full and draft columns)."""
    cache = CaptureCache(llama, samples, budget_bytes=1 << 30)
    idx = [0, 1]
    width = max(len(samples[i].input_ids) for i in idx)
    cap = cache.capture(idx, width, torch.device("cpu"))
    assert cap.aux.shape[:2] == (2, width) and cap.logits is None
    for row, i in enumerate(idx):
        n = len(samples[i].input_ids)
        live = llama.capture(torch.tensor([samples[i].input_ids]))
        torch.testing.assert_close(cap.aux[row, :n], live.aux[0])
        torch.testing.assert_close(cap.full_logits()[row, :n], live.logits[0])
        cols = torch.tensor([5, 0, 17])
        torch.testing.assert_close(cap.logits_for(cols)[row, :n], live.logits[0][:, cols],
                                   rtol=1e-5, atol=1e-5)
        assert torch.equal(cap.target_argmax()[row, :n], live.logits[0].argmax(-1))
        assert not cap.aux[row, n:].any()  # padding is zeros


def test_budget_caps_memory_and_hits_reuse(llama, samples) -> None:  # noqa: ANN001
    cpu = torch.device("cpu")
    one = CaptureCache(llama, samples, budget_bytes=1 << 30)
    one.entry(0, cpu)
    per_sample = one.used
    cache = CaptureCache(llama, samples, budget_bytes=per_sample)  # room for one sample
    a = cache.entry(0, cpu)
    assert cache.entry(0, cpu) is a and (cache.hits, cache.misses) == (1, 1)
    b = cache.entry(1, cpu)
    assert cache.entry(1, cpu) is not b  # over budget: recomputed, not kept
    assert cache.used == per_sample and list(cache.entries) == [0]
    assert torch.equal(cache.entry(1, cpu).aux, b.aux)  # recomputation is deterministic


def test_fill_captures_every_sample_within_the_budget(llama, samples) -> None:  # noqa: ANN001
    cpu = torch.device("cpu")
    cache = CaptureCache(llama, samples, budget_bytes=1 << 30)
    cache.fill(cpu)
    assert sorted(cache.entries) == list(range(len(samples))) and cache.misses == len(samples)
    cache.capture([0, 1], len(samples[0].input_ids), cpu)
    assert cache.misses == len(samples) and cache.hits == 2  # training starts on hits
    one = cache.entries[0].nbytes
    small = CaptureCache(llama, samples, budget_bytes=one)
    small.fill(cpu)
    assert list(small.entries) == [0] and small.used <= one  # the rest computed, not kept


@pytest.mark.parametrize("head", ["eagle", "eagle3", "peagle"])
def test_training_is_identical_with_and_without_the_cache(head: str, llama, samples) -> None:  # noqa: ANN001
    """A cache hit and a miss give the same tensors, so the budget never changes the head."""
    data = TrainData(llama, samples)
    base = dict(head=head, max_steps=8, batch_size=2, draft_vocab_size=64, progress=False,
                lr=2e-3, warmup_steps=2)
    cached = train(TrainConfig(capture_cache_mb=1024, **base), data)  # type: ignore[arg-type]
    uncached = train(TrainConfig(capture_cache_mb=0, **base), data)  # type: ignore[arg-type]
    assert [h["loss"] for h in cached.history] == [h["loss"] for h in uncached.history]
    for k, v in cached.head.state_dict().items():
        assert torch.equal(v, uncached.head.state_dict()[k]), k


def test_cached_loss_close_to_a_live_padded_batch(llama, samples) -> None:  # noqa: ANN001
    """The cached per-sample capture gives the same loss as one live padded forward."""
    from eaglenest.models.heads.registry import HEADS

    cfg = TrainConfig(head="eagle3", draft_vocab_size=64)
    head = HEADS["eagle3"].build(llama, samples, cfg)
    batch = collate(samples[:2], 0, "cpu")
    live = head.loss(batch, llama.capture(batch.input_ids, batch.attention_mask), steps=3)
    cache = CaptureCache(llama, samples, budget_bytes=1 << 30)
    cached = head.loss(batch, cache.capture([0, 1], batch.input_ids.shape[1],
                                            torch.device("cpu")), steps=3)
    torch.testing.assert_close(cached.loss, live.loss, rtol=1e-4, atol=1e-5)
