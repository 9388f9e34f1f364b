from __future__ import annotations

import torch

from eaglenest.models.training.optim import Muon, orthogonalize


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


def test_ns_dtype_choice(monkeypatch) -> None:  # noqa: ANN001
    import pytest

    import eaglenest.models.training.optim as optim

    cpu = torch.device("cpu")
    assert optim.ns_dtype("float32", cpu) is torch.float32
    assert optim.ns_dtype("bfloat16", cpu) is torch.bfloat16
    monkeypatch.setattr(optim, "_cpu_has_bf16_units", lambda: True)
    assert optim.ns_dtype("auto", cpu) is torch.bfloat16
    monkeypatch.setattr(optim, "_cpu_has_bf16_units", lambda: False)
    assert optim.ns_dtype("auto", cpu) is torch.float32
    assert optim.ns_dtype("auto", torch.device("cuda")) is torch.bfloat16
    with pytest.raises(ValueError, match="muon_ns_dtype must be one of .*'float16'"):
        optim.ns_dtype("float16", cpu)


def test_bf16_newton_schulz_is_close_to_fp32_and_keeps_the_dtype() -> None:
    torch.manual_seed(0)
    g = torch.randn(48, 144)
    full = orthogonalize(g, dtype=torch.float32)
    half = orthogonalize(g, dtype=torch.bfloat16)
    assert half.dtype is torch.float32
    assert not torch.equal(full, half)  # it really ran in bf16
    assert ((full - half).norm() / full.norm()) < 0.05


def test_muon_steps_in_the_chosen_dtype() -> None:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(24, 64)) for _ in range(2)]
    with torch.no_grad():
        params[1].copy_(params[0])
    start = params[0].detach().clone()
    opts = [Muon([params[0]], lr=0.02, ns_dtype=torch.float32),
            Muon([params[1]], lr=0.02, ns_dtype=torch.bfloat16)]
    for _ in range(3):
        grad = torch.randn(24, 64)
        for p, o in zip(params, opts, strict=True):
            p.grad = grad.clone()
            o.step()
    a, b = params[0].detach() - start, params[1].detach() - start
    assert not torch.equal(a, b)
    torch.testing.assert_close(a, b, rtol=0, atol=0.05 * a.abs().max().item())
