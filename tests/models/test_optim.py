from __future__ import annotations

import torch

from models.optim import Muon, orthogonalize


def test_orthogonalize_pulls_singular_values_to_one() -> None:
    g = torch.diag(torch.tensor([3.0, 0.5]))
    out = orthogonalize(g)
    assert out[0, 1] == 0 and out[1, 0] == 0  # directions kept
    assert 0.6 < out[0, 0] < 1.2 and 0.6 < out[1, 1] < 1.2
    torch.manual_seed(0)
    for shape in ((40, 120), (120, 40)):  # wide and tall
        x = torch.randn(*shape) * torch.logspace(-1, 0, shape[1])  # columns spread 10x
        s = torch.linalg.svdvals(orthogonalize(x))
        assert s.min() > 0.5 and s.max() < 1.3, (shape, s.min(), s.max())


def test_muon_step_matches_torch_muon() -> None:
    """Same update as torch.optim.Muon (bf16 inside) with match_rms_adamw, within bf16 error."""
    torch.manual_seed(0)
    ours, ref = torch.nn.Parameter(torch.randn(24, 64)), torch.nn.Parameter(torch.zeros(24, 64))
    with torch.no_grad():
        ref.copy_(ours)
    opt_a = Muon([ours], lr=0.02, weight_decay=0.1)
    opt_b = torch.optim.Muon([ref], lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    start = ours.detach().clone()
    for _ in range(3):
        grad = torch.randn(24, 64)
        ours.grad, ref.grad = grad.clone(), grad.clone()
        opt_a.step()
        opt_b.step()
    moved_a, moved_b = ours.detach() - start, ref.detach() - start
    assert moved_a.abs().mean() > 5e-3  # it did move
    torch.testing.assert_close(moved_a, moved_b, rtol=0, atol=1.5e-2 * moved_b.abs().max().item())
