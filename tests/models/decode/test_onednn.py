"""oneDNN-repacked linears (models/decode/onednn.py) and last-token-only prefill logits."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from eaglenest.models.decode import SpeculativeEngine
from eaglenest.models.decode.kernels import KernelPolicy
from eaglenest.models.decode.onednn import OneDNNLinear, onednn_available, onednn_copy
from eaglenest.models.decode.runner import TargetRunner

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("lead", [(3,), (2, 5), (1, 1, 4)])
def test_onednn_linear_equals_linear(bias: bool, lead: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    lin = nn.Linear(48, 80, bias=bias)
    x = torch.randn(*lead, 48)  # [..., in]
    fast = OneDNNLinear(lin)
    y = fast(x)
    assert y.shape == (*lead, 80)
    torch.testing.assert_close(y, lin(x).detach(), atol=1e-5, rtol=1e-5)


def test_copy_shares_everything_but_the_linears(llama) -> None:  # noqa: ANN001
    model = llama.model
    fast = onednn_copy(model)
    assert fast is not model and onednn_copy(model) is fast  # one copy per model object
    linears = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    assert linears and all(type(fast.get_submodule(n)) is OneDNNLinear for n in linears)
    assert all(type(model.get_submodule(n)) is nn.Linear for n in linears)  # original intact
    assert fast.model.embed_tokens.weight is model.model.embed_tokens.weight
    assert fast.model.norm.weight is model.model.norm.weight
    ids = torch.tensor([[5, 17, 33, 80, 9]])
    with torch.no_grad():
        torch.testing.assert_close(fast(ids).logits, model(ids).logits, atol=1e-4, rtol=1e-4)


def test_engine_repacks_only_where_it_applies(llama, make_head) -> None:  # noqa: ANN001
    head = make_head(llama, "eagle3")
    off = SpeculativeEngine(llama, head, "chain", k=3, kernels=KernelPolicy(force="stock"))
    on = SpeculativeEngine(llama, head, "chain", k=3, kernels=KernelPolicy(force="onednn"))
    auto = SpeculativeEngine(llama, head, "chain", k=3)
    assert off.model is llama.model and off.head is head
    for model in (on.model, on.head):
        assert model is not None and not any(type(m) is nn.Linear for m in model.modules())
    assert on.model is not llama.model and on.head is not head  # copies: originals intact
    assert auto.model is on.model  # too small to time: oneDNN on float32 CPU by default
    prompt = [5, 17, 33, 80, 9, 100]
    assert on.generate_ids(prompt, 20) == off.generate_ids(prompt, 20)
    assert not onednn_available(nn.Linear(4, 4).to(torch.bfloat16))


def test_prefill_computes_last_logits_only(llama) -> None:  # noqa: ANN001
    prompt = [5, 17, 33, 80, 9, 100]
    full = TargetRunner(llama.model).forward(prompt)
    last = TargetRunner(llama.model).forward(prompt, last_logits_only=True)
    assert full.logits.shape[0] == len(prompt) and last.logits.shape[0] == 1
    torch.testing.assert_close(last.logits[0], full.logits[-1])
    torch.testing.assert_close(last.last_hidden, full.last_hidden)  # every row's features


def test_repack_in_place_is_not_copied_again(tiny_target) -> None:  # noqa: ANN001
    """The embedded server repacks its own model in place; the engine then uses it as is."""
    model = copy.deepcopy(tiny_target("Qwen2ForCausalLM").model)  # q/k/v with bias; own copy
    ids = torch.tensor([[5, 17, 33, 80, 9]])
    with torch.no_grad():
        before = model(ids).logits
    from eaglenest.models.decode.onednn import is_repacked, repack_linears

    assert not is_repacked(model)
    assert repack_linears(model) is model and is_repacked(model)
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert SpeculativeEngine(model, None).model is model and onednn_copy(model) is model
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, atol=1e-4, rtol=1e-4)
