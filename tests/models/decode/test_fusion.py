"""Sibling projections fused into one linear (models/decode/fusion.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from eaglenest.models.decode.engine import SpeculativeEngine
from eaglenest.models.decode.fusion import (
    Siblings,
    SiblingSlice,
    fuse_siblings,
    fused_siblings,
    sibling_groups,
)
from eaglenest.models.decode.kernels import KernelPolicy
from eaglenest.models.decode.runner import TargetRunner

FUSABLE = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]


@pytest.mark.parametrize("arch", FUSABLE)
def test_fused_target_gives_the_unfused_outputs_on_both_forwards(arch, tiny_target) -> None:  # noqa: ANN001
    target = tiny_target(arch)
    engine = SpeculativeEngine(target, None, kernels=KernelPolicy(force="onednn"))
    model = engine.model
    assert engine.kernels.fused == 2 * len(model.model.layers)
    assert f"; {engine.kernels.fused} sibling groups fused" in engine.kernels.summary()
    unfused = SpeculativeEngine(target, None, kernels=KernelPolicy(force="onednn", fuse=False))
    assert unfused.kernels.fused == 0 and unfused.model is not model
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.k_proj, SiblingSlice)
    assert isinstance(layer.mlp.up_proj, SiblingSlice)
    assert type(target.model.model.layers[0].self_attn.k_proj) is nn.Linear  # the original
    products = []
    for lay in model.model.layers:  # one fused product per group and forward, either way
        for owner, names in ((lay.self_attn, ("q_proj",)), (lay.mlp, ("gate_proj",))):
            sib = fused_siblings(owner, names)
            assert sib is not None
            sib.fused.register_forward_hook(lambda *_: products.append(1))
    ref = TargetRunner(target.model, direct=False)
    runners = [TargetRunner(model), TargetRunner(model, direct=False)]
    tokens = list(range(20, 60))
    want = ref.forward(tokens).logits
    for runner in runners:
        products.clear()
        torch.testing.assert_close(runner.forward(tokens).logits, want, atol=1e-5, rtol=1e-5)
        assert len(products) == 2 * len(model.model.layers)


def test_stock_linears_are_not_fused(llama) -> None:  # noqa: ANN001
    model = SpeculativeEngine(llama, None, kernels=KernelPolicy(force="stock")).model
    assert type(model.model.layers[0].self_attn.q_proj) is nn.Linear
    assert fuse_siblings(model, lambda name: None) == set()


def test_a_sibling_recomputes_for_another_or_changed_input() -> None:
    torch.manual_seed(0)
    a, b = nn.Linear(4, 3), nn.Linear(4, 2)
    fused = nn.Linear(4, 5)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([a.weight, b.weight]))
        fused.bias.copy_(torch.cat([a.bias, b.bias]))
    calls: list[int] = []
    fused.register_forward_hook(lambda *_: calls.append(1))
    sib = Siblings(fused, [3, 2])
    first, second = SiblingSlice(sib, 0), SiblingSlice(sib, 1)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(first(x), a(x))
        torch.testing.assert_close(second(x), b(x))
        assert len(calls) == 1  # one product for both parts
        first(x)
        x.mul_(2)  # changed in place: the kept product is stale
        torch.testing.assert_close(second(x), b(x))
        assert len(calls) == 3
        torch.testing.assert_close(first(torch.ones(1, 4)), a(torch.ones(1, 4)))
        assert len(calls) == 4


def test_sibling_groups_follow_fuse_siblings() -> None:
    names = [f"model.layers.0.self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
    names += ["model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj",  # no gate: alone
              "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"]
    assert sibling_groups(names) == [
        names[:3], [names[3]], [names[4]], [names[5]], names[6:]]
    assert sibling_groups(["lm_head", "fc"]) == [["lm_head"], ["fc"]]
