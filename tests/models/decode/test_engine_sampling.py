"""Sampling through the engine: the emitted tokens follow the target's distribution."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from eaglenest.models.decode import SpeculativeEngine
from eaglenest.models.decode.sampling import SamplingParams, target_probs
from tests.models.decode.oracle import OracleDrafter

PROMPT = [5, 17, 33, 80, 9, 100]
PARAMS = SamplingParams(temperature=0.01, top_p=0.99)  # tiny random logits: sharpen them
N = 300


def _exact_joint(model) -> dict[tuple[int, int], float]:  # noqa: ANN001
    """P(t1, t2) = p(t1 | prompt) * p(t2 | prompt, t1) under temperature + top-p."""
    with torch.no_grad():
        p1 = target_probs(model(torch.tensor([PROMPT])).logits[0, -1], PARAMS)
        joint = {}
        for t1 in p1.nonzero().flatten().tolist():
            p2 = target_probs(model(torch.tensor([PROMPT + [t1]])).logits[0, -1], PARAMS)
            for t2 in p2.nonzero().flatten().tolist():
                joint[(t1, t2)] = float(p1[t1] * p2[t2])
    return joint


@pytest.mark.parametrize(
    "mode", ["chain", *(pytest.param(m, marks=pytest.mark.slow) for m in ("tree", "parallel"))]
)
def test_two_token_joint_matches_target(mode, llama) -> None:  # noqa: ANN001
    greedy = SpeculativeEngine(llama, None).generate_ids(PROMPT, 8)
    # drafts: the greedy continuation, every other position demoted to rank 1; gap 0.01 at
    # temperature 0.01 gives q = softmax(-rank): a spread-out q, far from p
    rank = lambda i: 0 if i % 2 else 1  # noqa: E731
    factory = lambda: OracleDrafter(PROMPT + greedy, 360, rank=rank, gap=0.01)  # noqa: E731
    engine = SpeculativeEngine(llama, None, mode, k=2, depth=2, topk=3, total_tokens=7,
                               drafter_factory=factory)
    joint = _exact_joint(llama.model)
    counts: dict[tuple[int, int], int] = {}
    for seed in range(N):
        out = engine.generate_ids(PROMPT, 2, temperature=PARAMS.temperature, top_p=PARAMS.top_p,
                                  seed=seed)
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1  # type: ignore[index]
    assert set(counts) <= set(joint)
    big = [c for c, p in joint.items() if p * N >= 10]  # pool rare cells into one
    obs = [counts.get(c, 0) for c in big] + [N - sum(counts.get(c, 0) for c in big)]
    exp = [joint[c] * N for c in big] + [N * (1 - sum(joint[c] for c in big))]
    assert chisquare(obs, exp).pvalue > 1e-3
    assert engine.stats.num_accepted_tokens > 0  # drafts were really accepted sometimes
