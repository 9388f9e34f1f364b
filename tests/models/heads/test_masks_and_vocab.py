"""Hand-checked tensors: attention masks, shifts, COD keep masks, d2t/t2d."""

from __future__ import annotations

import torch

from eaglenest.models.heads.layers import causal_mask, shift_left, ttt_mask
from eaglenest.models.heads.peagle import cod_keep, parallel_mask
from eaglenest.models.heads.vocab import build_draft_vocab, draft_to_target, token_counts


def b(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def test_causal_mask_with_cache() -> None:
    assert torch.equal(causal_mask(2, 1), b([[1, 1, 0], [1, 1, 1]]))


def test_ttt_masks() -> None:
    assert torch.equal(ttt_mask(3, 0), b([[1, 0, 0], [1, 1, 0], [1, 1, 1]]))
    assert torch.equal(
        ttt_mask(3, 1), b([[1, 0, 0, 1, 0, 0], [1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 1]])
    )
    step2 = ttt_mask(2, 2)
    assert torch.equal(step2, b([[1, 0, 1, 0, 1, 0], [1, 1, 0, 1, 0, 1]]))


def test_parallel_mask() -> None:
    assert torch.equal(
        parallel_mask(2, 2), b([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]])
    )
    m = parallel_mask(3, 3)
    # depth-2 query of anchor 1: block 0 slots 0..1, its own depth-1 and depth-2 slots
    assert m[2 * 3 + 1].tolist() == [1, 1, 0, 0, 1, 0, 0, 1, 0]


def test_shift_left() -> None:
    x = torch.tensor([[1, 2, 3, 4]])
    assert shift_left(x, 2).tolist() == [[3, 4, 0, 0]]
    assert shift_left(x, 0).tolist() == [[1, 2, 3, 4]]
    assert shift_left(x, 9, -1).tolist() == [[-1, -1, -1, -1]]


def test_cod_keep_is_conditional() -> None:
    torch.manual_seed(0)
    keep = cod_keep(50, 4, 0.5)
    assert keep[0].all()
    assert not (keep[1:] & ~keep[:-1]).any()  # depth k kept only where depth k-1 kept
    assert cod_keep(5, 3, 1.0).all()
    assert not cod_keep(5, 3, 0.0)[1:].any()


def test_d2t_t2d_hand_checked() -> None:
    d2t, t2d = build_draft_vocab(torch.tensor([5, 0, 9, 1, 7]), 3)
    assert d2t.tolist() == [0, 1, 2]
    assert t2d.tolist() == [True, False, True, False, True]
    assert draft_to_target(torch.tensor([0, 1, 2]), d2t).tolist() == [0, 2, 4]
    # ties go to the lower id
    d2t, t2d = build_draft_vocab(torch.tensor([1, 3, 3, 0, 3]), 2)
    assert draft_to_target(torch.arange(2), d2t).tolist() == [1, 2]


def test_token_counts() -> None:
    assert token_counts([[1, 1, 3], [], [0]], 4).tolist() == [1, 2, 0, 1]
