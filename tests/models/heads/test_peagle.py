from __future__ import annotations

import torch

from eaglenest.models.heads.layers import causal_mask
from eaglenest.models.heads.peagle import PEagleHead, cod_keep
from eaglenest.models.heads.peagle import build as _build_peagle
from eaglenest.models.training.config import TrainConfig


def make_head(llama, samples) -> PEagleHead:  # noqa: ANN001
    torch.manual_seed(0)
    return _build_peagle(llama, samples, TrainConfig(draft_vocab_size=64)).eval()


def test_mask_hidden_and_token(llama, samples) -> None:  # noqa: ANN001
    head = make_head(llama, samples)
    assert head.mask_hidden.shape == (1, 1, 3 * llama.hidden_size)
    assert head.mask_hidden.requires_grad
    assert head.cfg.mask_token_id == llama.tokenizer.pad_token_id


def test_parallel_training_equals_inference_forward(llama, samples) -> None:  # noqa: ANN001
    """Depth k at anchor i in the training layout == the single inference forward."""
    head = make_head(llama, samples)
    x = torch.tensor([samples[1].input_ids[:10]])
    aux = llama.capture(x).aux
    depth = 3
    full = head.parallel_forward(x, aux, depth, torch.ones(depth, 10, dtype=torch.bool))
    for i in (0, 3, 6):
        n = i + 1
        mt, mh = head.mask_slots(1, depth - 1)
        tokens = torch.cat([x[:, 1 : n + 1], mt], 1)
        hidden = torch.cat([head.combine(aux[:, :n]), mh], 1)
        pos = torch.arange(n + depth - 1).unsqueeze(0)
        logits, _, _ = head.step(tokens, hidden, pos, causal_mask(n + depth - 1))
        for k in range(depth):
            torch.testing.assert_close(logits[0, n - 1 + k], full[k][0, i], atol=1e-5, rtol=1e-5)
        drafts = head.draft_parallel(x[:, : n + 1], aux[:, :n], depth)
        assert drafts.tolist() == head.to_target_ids(logits[0, n - 1 :].argmax(-1)).tolist()


def test_cod_subset_keeps_kept_slots_exact(llama, samples) -> None:  # noqa: ANN001
    head = make_head(llama, samples)
    x = torch.tensor([samples[1].input_ids[:16]])
    aux = llama.capture(x).aux
    depth = 4
    full = head.parallel_forward(x, aux, depth, torch.ones(depth, 16, dtype=torch.bool))
    torch.manual_seed(3)
    keep = cod_keep(16, depth, 0.5)
    part = head.parallel_forward(x, aux, depth, keep)
    for k in range(depth):
        slots = keep[k]
        torch.testing.assert_close(part[k][0, slots], full[k][0, slots], atol=1e-5, rtol=1e-5)
