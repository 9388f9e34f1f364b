from __future__ import annotations

import torch

from eaglenest.models.heads.base import HeadBatch
from eaglenest.models.heads.eagle import build as _build_eagle
from eaglenest.models.heads.layers import causal_mask
from eaglenest.models.training.config import TrainConfig


def test_eagle_head_structure(llama, samples) -> None:  # noqa: ANN001
    head = _build_eagle(llama, samples, TrainConfig(head="eagle"))
    names = set(head.state_dict())
    assert "fc.weight" in names and "layers.0.post_attention_layernorm.weight" in names
    assert not any("input_layernorm" in n for n in names)  # EAGLE-1 drops it
    assert not any(n.startswith("norm.") for n in names)  # no final norm
    assert head.fc.weight.shape == (llama.hidden_size, 2 * llama.hidden_size)
    assert not head.lm_head.weight.requires_grad
    torch.testing.assert_close(head.lm_head.weight, llama.lm_head_weight())


def test_eagle_chain_uses_own_output_as_feature(llama, samples) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    head = _build_eagle(llama, samples, TrainConfig(head="eagle")).eval()
    x = torch.tensor([samples[0].input_ids[:9]])
    feats = llama.capture(x).last_hidden
    drafts = head.draft_greedy(x, feats[:, :8], 3)
    # by hand: recompute the whole draft sequence each step without a KV cache
    tokens, hidden = x[:, 1:], feats[:, :8]
    expected = []
    for _ in range(3):
        n = tokens.shape[1]
        logits, out, _ = head.step(tokens, hidden, torch.arange(n).unsqueeze(0), causal_mask(n))
        expected.append(int(logits[0, -1].argmax()))
        tokens = torch.cat([tokens, torch.tensor([[expected[-1]]])], 1)
        hidden = torch.cat([hidden, out[:, -1:]], 1)
    assert drafts.tolist() == expected


def test_eagle_loss(llama, samples) -> None:  # noqa: ANN001
    head = _build_eagle(llama, samples, TrainConfig(head="eagle"))
    x = torch.tensor([samples[0].input_ids[:30]])
    lm = torch.tensor([samples[0].loss_mask[:30]], dtype=torch.bool)
    out = head.loss(HeadBatch(x, lm, torch.ones_like(x)), llama.capture(x))
    out.loss.backward()
    assert out.step_counts[0] == int(lm[0, 2:].sum())
    assert head.fc.weight.grad is not None and head.lm_head.weight.grad is None
