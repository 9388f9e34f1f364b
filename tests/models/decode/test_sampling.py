"""Verification rules: greedy by hand, rejection sampling against the target (chi-square)."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from eaglenest.models.decode.sampling import (
    SamplingParams,
    residual,
    target_probs,
    verify_greedy,
    verify_rejection,
    verify_siblings,
)

P = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
Q = torch.tensor([0.10, 0.10, 0.50, 0.05, 0.05, 0.20])
N = 20000


def _onehot_rows(ids: list[int], vocab: int = 10) -> torch.Tensor:
    rows = torch.zeros(len(ids), vocab)
    rows[torch.arange(len(ids)), torch.tensor(ids)] = 5.0
    return rows


def test_verify_greedy_by_hand() -> None:
    logits = _onehot_rows([5, 7, 9, 2])
    assert verify_greedy(logits, [5, 7, 1]) == (2, 9)
    assert verify_greedy(logits, [5, 7, 9]) == (3, 2)  # all accepted: bonus from last row
    assert verify_greedy(logits, [4, 7, 9]) == (0, 5)


def test_top_p_example() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    got = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))
    torch.testing.assert_close(got, torch.tensor([0.625, 0.375, 0.0]))
    torch.testing.assert_close(residual(P, Q).sum(), torch.tensor(1.0))


def _check(counts: torch.Tensor, p: torch.Tensor) -> None:
    keep = p > 0
    stat = chisquare(counts[keep].numpy(), (p[keep] * counts.sum()).numpy())
    assert stat.pvalue > 1e-3, stat
    assert int(counts[~keep].sum()) == 0


def test_rejection_with_sampled_draft_matches_target() -> None:
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(6)
    rows = torch.stack([P, P])
    for _ in range(N):
        draft = int(torch.multinomial(Q, 1, generator=gen))
        accepted, nxt = verify_rejection(rows, [draft], Q.view(1, -1), gen)
        counts[draft if accepted else nxt] += 1
    _check(counts, P)


def test_rejection_with_deterministic_draft_matches_target() -> None:
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(6)
    for _ in range(N):
        accepted, nxt = verify_rejection(torch.stack([P, P]), [2], None, gen)
        counts[2 if accepted else nxt] += 1
    _check(counts, P)


def test_sibling_rule_matches_target() -> None:
    gen = torch.Generator().manual_seed(2)
    counts = torch.zeros(6)
    for _ in range(N):
        idx, tok = verify_siblings(P, [2, 0, 5], gen)
        counts[tok] += 1
    _check(counts, P)


def test_two_step_chain_joint_matches_target() -> None:
    """Joint law of (token 1, token 2) from a 2-draft chain equals p1 x p2 (p2 fixed here)."""
    gen = torch.Generator().manual_seed(3)
    p2 = torch.tensor([0.05, 0.05, 0.3, 0.3, 0.2, 0.1])
    rows = torch.stack([P, p2, P])
    counts = torch.zeros(6, 6)
    for _ in range(N):
        d = [int(torch.multinomial(Q, 1, generator=gen)) for _ in range(2)]
        accepted, nxt = verify_rejection(rows, d, torch.stack([Q, Q]), gen)
        out = (d[:accepted] + [nxt] + [int(torch.multinomial(p2, 1, generator=gen))])[:2]
        counts[out[0], out[1]] += 1
    _check(counts.flatten(), torch.outer(P, p2).flatten())
