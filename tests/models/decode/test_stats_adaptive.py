"""Stats arithmetic (vLLM's counters, tau) and the adaptive depth controller."""

from __future__ import annotations

from models.decode.adaptive import AdaptiveDepth
from models.decode.stats import SpecStats


def test_stats_docstring_example() -> None:
    st = SpecStats()
    st.record(3, 2)
    st.record(3, 0)
    st.record(0, 0)  # no drafts: not a draft round
    assert (st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens) == (2, 6, 2)
    assert st.accepted_per_pos == [1, 1, 0]
    assert st.acceptance_length == 2.0 and abs(st.acceptance_rate - 1 / 3) < 1e-9
    other = SpecStats()
    other.record(4, 4)
    st.merge(other)
    assert st.accepted_per_pos == [2, 2, 1, 1] and st.acceptance_length == 1 + 6 / 3
    assert SpecStats().acceptance_length == 1.0


def test_adaptive_docstring_example() -> None:
    ctl = AdaptiveDepth(k_max=3, prior_weight=1e-9)
    ctl.accepted, ctl.reached = [0.9, 0.8, 0.5], [1.0, 1.0, 1.0]
    ctl.step_cost, ctl.verify_cost = 0.005, {2: 0.1, 4: 0.1}
    assert [round(ctl.expected_tokens(k), 2) for k in (1, 2, 3)] == [1.9, 2.62, 2.98]
    assert ctl.choose(lambda k: k + 1) == 3


def test_adaptive_shrinks_on_rejection_and_grows_on_acceptance() -> None:
    ctl = AdaptiveDepth(k_max=8)
    for _ in range(30):
        ctl.update(4, 0, draft_seconds=0.02, verify_seconds=0.1, size=5)
    assert ctl.choose(lambda k: k + 1) == 1
    ctl = AdaptiveDepth(k_max=8)
    for _ in range(30):
        ctl.update(4, 4, draft_seconds=0.004, verify_seconds=0.1, size=5)
    assert ctl.choose(lambda k: k + 1) >= 5


def test_verify_cost_interpolation() -> None:
    ctl = AdaptiveDepth()
    ctl.verify_cost = {2: 1.0, 6: 2.0}
    assert ctl.verify_seconds(4) == 1.5
    assert ctl.verify_seconds(8) == 2.0 * 1.1


def test_adaptive_goes_plain_when_drafts_do_not_pay_then_tries_again() -> None:
    """k_min=0: rejected drafts make K = 0 (a plain round) the best rate; plain rounds add no
    acceptance evidence, the counts decay to the prior and drafting is tried again."""
    ctl = AdaptiveDepth(k_min=0, k_max=8)
    for _ in range(30):
        ctl.update(4, 0, draft_seconds=0.02, verify_seconds=0.1, size=5)
    ctl.update(0, 0, draft_seconds=0.0, verify_seconds=0.06, size=1)
    assert ctl.step_cost is not None and abs(ctl.step_cost - 0.005) < 1e-9  # plain: unchanged
    assert ctl.choose(lambda k: k + 1) == 0
    rounds = 0
    while ctl.choose(lambda k: k + 1) == 0 and rounds < 200:
        ctl.update(0, 0, draft_seconds=0.0, verify_seconds=0.06, size=1)
        rounds += 1
    assert 0 < rounds < 200 and ctl.choose(lambda k: k + 1) >= 1
    # with k_min=1 (tree depth) plain is never chosen
    ctl = AdaptiveDepth(k_min=1, k_max=8)
    for _ in range(30):
        ctl.update(4, 0, draft_seconds=0.02, verify_seconds=0.1, size=5)
    assert ctl.choose(lambda k: k + 1) == 1


def test_parallel_plain_round_costs_no_draft_forward() -> None:
    ctl = AdaptiveDepth(k_min=0, k_max=4, parallel=True, prior_weight=1e-9)
    ctl.accepted, ctl.reached = [0.1], [1.0]  # drafts almost never accepted
    ctl.step_cost, ctl.verify_cost = 0.05, {1: 0.1, 5: 0.1}
    # K = 0: 1 token / 0.1 s beats K >= 1: ~1.1 tokens / 0.15 s
    assert ctl.choose(lambda k: k + 1) == 0
