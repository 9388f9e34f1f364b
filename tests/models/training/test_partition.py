"""Sequence partitioning (models/training/partition.py): P-EAGLE's loss over parts of the anchors,
a backward each, gives the whole step's loss and gradients, and training in parts follows
the same path as training whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eaglenest.models.heads.base import Partition
from eaglenest.models.heads.peagle import build, cod_keep, parallel_mask, slot_mask
from eaglenest.models.training.config import TrainConfig
from eaglenest.models.training.evaluate import collate
from eaglenest.models.training.partition import merged
from eaglenest.models.training.train import TrainData, train


@pytest.mark.parametrize(("seq", "depth"), [(1, 1), (5, 2), (9, 4)])
def test_slot_mask_is_the_full_masks_rows_and_columns(seq: int, depth: int) -> None:
    """For the slots COD keeps, and for arbitrary subsets of slots."""
    gen = torch.Generator().manual_seed(seq * 10 + depth)
    full = parallel_mask(seq, depth)
    keeps = [cod_keep(seq, depth, 0.6, generator=gen).flatten(),
             torch.rand(depth * seq, generator=gen) < 0.5,
             torch.ones(depth * seq, dtype=torch.bool)]
    for keep in keeps:
        idx = keep.nonzero().squeeze(1)
        assert torch.equal(slot_mask(idx, seq), full[idx][:, idx])
    assert slot_mask(torch.tensor([0, 1, 3]), 2).tolist() == [  # the docstring's example
        [True, False, False], [True, True, False], [True, True, True]]


def grads(head: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in head.named_parameters() if p.grad is not None}
    head.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("parts", [2, 3, 7])
def test_parts_sum_to_the_whole_loss_and_gradients(parts: int, llama, samples) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    head = build(llama, samples, TrainConfig(draft_vocab_size=64))
    batch = collate(samples[:2], llama.tokenizer.pad_token_id, torch.device("cpu"))
    cap = llama.capture(batch.input_ids, batch.attention_mask)
    kw = {"steps": 4, "decay": 0.8, "keep_prob": 0.7}
    whole = head.loss(batch, cap, **kw, partition=Partition(0, 1, seed=5))
    whole.loss.backward()
    expected = grads(head)
    results = []
    for index in range(parts):
        part = head.loss(batch, cap, **kw, partition=Partition(index, parts, seed=5))
        part.loss.backward()
        results.append(part)
    got = grads(head)
    assert set(got) == set(expected) and "mask_hidden" in got
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=1e-4)
    total = merged(results)
    torch.testing.assert_close(total.loss, whole.loss.detach(), atol=1e-6, rtol=1e-5)
    assert total.step_counts == whole.step_counts and min(whole.step_counts) > 0
    for a, b in zip(total.step_accuracy, whole.step_accuracy, strict=True):
        assert a == pytest.approx(b)


def test_training_in_parts_follows_the_same_path(llama, samples, tmp_path: Path) -> None:  # noqa: ANN001
    def run(parts: int) -> list[float]:
        config = TrainConfig(head="peagle", max_steps=4, draft_vocab_size=64, progress=False,
                             lr=2e-3, warmup_steps=2, seq_partitions=parts)
        return [row["loss"] for row in train(config, TrainData(llama, samples)).history]

    whole = run(1)
    assert run(3) == pytest.approx(whole, rel=1e-4)
    parted = r"\['peagle', 'dflash'\]"  # the kinds whose HeadSpec.partitions is set
    with pytest.raises(ValueError, match=f"seq_partitions=2: 1, or more for {parted}"):
        train(TrainConfig(head="eagle3", seq_partitions=2, progress=False),
              TrainData(llama, samples))
