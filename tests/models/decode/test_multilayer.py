"""Multi-layer EAGLE-3 / P-EAGLE heads in the engine: the per-layer keys/values stacked in
one head cache give the same drafts as the head's own uncached forward, and decoding with
such heads stays lossless in every mode."""

from __future__ import annotations

import pytest
import torch

from eaglenest.models.decode.drafter import HeadDrafter
from eaglenest.models.decode.engine import SpeculativeEngine
from eaglenest.models.decode.runner import TargetRunner
from eaglenest.models.decode.sampling import SamplingParams
from eaglenest.models.heads.layers import causal_mask, join_layers, split_layers

PROMPTS = [[5, 17, 33, 80, 9, 100], list(range(60, 90)), [1, 42, 7]]


def test_split_and_join_layers_round_trip() -> None:
    keys = [torch.full((1, 3, 5, 4), float(i)) for i in range(2)]
    joined = join_layers([(k, k + 10) for k in keys])
    assert joined[0].shape == (1, 6, 5, 4)
    parts = split_layers(joined, 2)
    assert [float(p[0][0, 0, 0, 0]) for p in parts] == [0.0, 1.0]  # type: ignore[index]
    assert [float(p[1][0, 2, 4, 3]) for p in parts] == [10.0, 11.0]  # type: ignore[index]
    assert split_layers(None, 3) == [None, None, None]


@pytest.mark.parametrize("kind", ["eagle3@2", "peagle@3"])
def test_step_with_cached_layers_equals_one_forward(kind, llama, make_head) -> None:  # noqa: ANN001
    """Slots 0..4 in one call, then 5..8 one at a time from the stacked cache: same logits."""
    head = make_head(llama, kind)
    torch.manual_seed(1)
    n, split = 9, 5
    tokens = torch.randint(0, llama.vocab_size, (1, n))
    hidden = torch.randn(1, n, head.cfg.hidden_size)
    pos = torch.arange(n).unsqueeze(0)
    whole, _, kv = head.step(tokens, hidden, pos, causal_mask(n))
    assert kv[0].shape[1] == len(head.layers) * head.cfg.num_key_value_heads
    logits, _, past = head.step(tokens[:, :split], hidden[:, :split], pos[:, :split],
                                causal_mask(split))
    rows = [logits]
    for i in range(split, n):
        logits, _, past = head.step(tokens[:, i:i + 1], hidden[:, i:i + 1], pos[:, i:i + 1],
                                    causal_mask(1, i), past)
        rows.append(logits)
    torch.testing.assert_close(torch.cat(rows, 1), whole, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["eagle3@2", "peagle@2"])
def test_cached_chain_equals_uncached_greedy(kind, llama, make_head) -> None:  # noqa: ANN001
    head = make_head(llama, kind)
    assert len(head.layers) == 2
    for prompt in PROMPTS:
        drafter = HeadDrafter(head)
        step = TargetRunner(llama.model, drafter.aux_layer_ids).forward(prompt)
        first = int(step.logits[-1].argmax())
        drafter.extend(prompt[1:] + [first], drafter.features(step, slice(None)))
        cached, _ = drafter.draft_chain(4, SamplingParams(0.0, 1.0), None)
        aux = llama.capture(torch.tensor([prompt])).aux
        uncached = head.draft_greedy(torch.tensor([prompt + [first]]), aux, 4).tolist()
        assert list(cached) == uncached, prompt


@pytest.mark.parametrize(("kind", "mode"), [("eagle3@2", "chain"), ("eagle3@2", "tree"),
                                            ("peagle@2", "parallel")])
def test_multilayer_heads_lossless(kind, mode, llama, make_head) -> None:  # noqa: ANN001
    engine = SpeculativeEngine(llama, make_head(llama, kind), mode, k=4, depth=4, topk=4,
                               total_tokens=16)
    plain = SpeculativeEngine(llama, None)
    for prompt in PROMPTS:
        assert engine.generate_ids(prompt, 24) == plain.generate_ids(prompt, 24), prompt
    assert engine.request_stats.num_draft_tokens > 0
