from __future__ import annotations

import torch

from eaglenest.models.heads.base import HeadBatch
from eaglenest.models.heads.eagle3 import Eagle3Head
from eaglenest.models.heads.eagle3 import build as _build_eagle3
from eaglenest.models.heads.layers import causal_mask
from eaglenest.models.training.config import TrainConfig


def make_head(llama, samples, **kw) -> Eagle3Head:  # noqa: ANN001
    torch.manual_seed(0)
    return _build_eagle3(llama, samples, TrainConfig(draft_vocab_size=64, **kw))


def test_structure_matches_vllm_names(llama, samples) -> None:  # noqa: ANN001
    head = make_head(llama, samples)
    names = set(head.state_dict())
    h = llama.hidden_size
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
    for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        assert f"layers.0.{n}.weight" in names
    assert head.fc.weight.shape == (h, 3 * h)
    assert head.layers[0].self_attn.q_proj.weight.shape[1] == 2 * h
    assert head.lm_head.weight.shape == (64, h)
    assert not head.embed_tokens.weight.requires_grad
    # lm_head starts from the target rows of the draft vocabulary
    torch.testing.assert_close(head.lm_head.weight, llama.lm_head_weight()[head.target_id_order()])


def test_ttt_steps_equal_sequential_drafting(llama, samples) -> None:  # noqa: ANN001
    """TTT step j at slot i == a real chain from slot i fed the teacher tokens."""
    head = make_head(llama, samples).eval()
    x = torch.tensor([samples[0].input_ids[:12]])
    aux = llama.capture(x).aux
    ttt = head.ttt_forward(x, aux, 3)
    for i in (0, 4, 8):
        n = i + 1
        pos = torch.arange(n).unsqueeze(0)
        logits, hidden, past = head.step(
            x[:, 1 : n + 1], head.combine(aux[:, :n]), pos, causal_mask(n)
        )
        torch.testing.assert_close(logits[0, -1], ttt[0][0, i], atol=1e-5, rtol=1e-5)
        hidden = hidden[:, -1:]
        for j in (1, 2):
            tok = x[:, i + 1 + j : i + 2 + j]
            pos = torch.tensor([[i + j]])
            logits, hidden, past = head.step(
                tok, hidden, pos, causal_mask(1, past[0].shape[2]), past
            )
            torch.testing.assert_close(logits[0, -1], ttt[j][0, i], atol=1e-5, rtol=1e-5)


def test_loss_masks_and_backward(llama, samples) -> None:  # noqa: ANN001
    head = make_head(llama, samples)
    x = torch.tensor([samples[0].input_ids[:40]])
    lm = torch.tensor([samples[0].loss_mask[:40]], dtype=torch.bool)
    batch = HeadBatch(x, lm, torch.ones_like(x))
    out = head.loss(batch, llama.capture(x), steps=3)
    assert len(out.step_accuracy) == 3
    # step j scores slots whose predicted token x[i+2+j] is an assistant token (and in vocab)
    assert out.step_counts[0] <= int(lm[0, 2:].sum())
    assert out.step_counts[0] >= out.step_counts[1] >= out.step_counts[2]
    out.loss.backward()
    assert head.fc.weight.grad is not None and head.embed_tokens.weight.grad is None


def test_no_loss_without_assistant_tokens(llama, samples) -> None:  # noqa: ANN001
    head = make_head(llama, samples)
    x = torch.tensor([samples[0].input_ids[:20]])
    batch = HeadBatch(x, torch.zeros_like(x, dtype=torch.bool), torch.ones_like(x))
    out = head.loss(batch, llama.capture(x))
    assert out.step_counts == [0, 0, 0] and float(out.loss.detach()) == 0.0


def test_norm_before_fc_and_norm_output(llama, samples) -> None:  # noqa: ANN001
    """norm_before_fc: fc reads RMS-normalised aux states (so their scale does not matter);
    norm_output: the hidden handed to the next step is the final norm's output."""
    plain = make_head(llama, samples, norm_before_fc=False, norm_output=False).eval()
    normed = make_head(llama, samples, norm_before_fc=True, norm_output=True).eval()
    assert normed.input_norm is not None and plain.input_norm is None
    x = torch.tensor([samples[0].input_ids[:8]])
    aux = llama.capture(x).aux
    eps = normed.cfg.rms_norm_eps
    by_hand = aux * torch.rsqrt(aux.pow(2).mean(-1, keepdim=True) + eps)  # weight starts at 1
    torch.testing.assert_close(normed.combine(aux), normed.fc(by_hand))
    torch.testing.assert_close(normed.combine(7.0 * aux), normed.combine(aux), rtol=1e-2, atol=0)
    assert not torch.allclose(plain.combine(7.0 * aux), plain.combine(aux), rtol=1e-2, atol=0)
    pos, mask = torch.arange(8).unsqueeze(0), causal_mask(8)
    logits, hidden, _ = normed.step(x, normed.combine(aux), pos, mask)
    # norm.weight starts at ones, so the handed-on rows have unit RMS ...
    torch.testing.assert_close(hidden.pow(2).mean(-1), torch.ones(1, 8), atol=1e-4, rtol=0)
    # ... and they are exactly what lm_head reads
    torch.testing.assert_close(normed.lm_head(hidden), logits)
    _, pre, _ = plain.step(x, plain.combine(aux), pos, mask)
    assert (pre.pow(2).mean(-1) - 1).abs().max() > 1e-2
