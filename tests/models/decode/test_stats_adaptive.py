"""Stats arithmetic (vLLM's counters, tau) and the adaptive depth controller."""

from __future__ import annotations

from eaglenest.models.decode.adaptive import AdaptiveDepth
from eaglenest.models.decode.stats import SpecStats


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
    ctl.step_cost, ctl.level, ctl.slope = 0.005, 0.1, 0.0  # verify 100 ms flat
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


def test_verify_cost_docstring_example() -> None:
    ctl = AdaptiveDepth(slope=0.03)
    ctl.update(5, 5, draft_seconds=0.01, verify_seconds=0.045, size=6)
    ctl.update(10, 10, draft_seconds=0.02, verify_seconds=0.054, size=11)
    assert abs(ctl.slope - 0.03125) < 1e-9
    assert ctl.level is not None and abs(ctl.verify_seconds(11) - 0.054) < 0.002


def test_verify_cost_follows_the_context_without_mixing_sizes() -> None:
    """Size 4 measured on a short prompt (43 ms), then a long prompt: size 6 once (65 ms),
    then size 4 (63 ms): size 6 is predicted at the long context's cost, not left dear
    (what a per-size table gave) nor cheap."""
    ctl = AdaptiveDepth(slope=0.02)
    for _ in range(20):
        ctl.update(3, 3, draft_seconds=0.006, verify_seconds=0.043, size=4)
    ctl.new_context()
    ctl.update(5, 5, draft_seconds=0.01, verify_seconds=0.065, size=6)
    for _ in range(20):
        ctl.update(3, 3, draft_seconds=0.006, verify_seconds=0.063, size=4)
    assert abs(ctl.verify_seconds(4) - 0.063) < 1e-3
    assert 0.063 < ctl.verify_seconds(6) < 0.068  # 63 ms + a few % per extra token
    assert 0.0 <= ctl.slope <= 0.1


def test_adaptive_goes_plain_when_drafts_do_not_pay_then_tries_again() -> None:
    """k_min=0: rejected drafts make K = 0 (a plain round) the best rate once a verified token
    costs more than a draft is worth (here each adds 20%: a compute-bound batch); plain
    rounds add no acceptance evidence, the counts decay to the prior and drafting is tried
    again."""
    ctl = AdaptiveDepth(k_min=0, k_max=8, slope=0.2)
    for _ in range(30):
        ctl.update(4, 0, draft_seconds=0.03, verify_seconds=0.18, size=5)
    ctl.update(0, 0, draft_seconds=0.0, verify_seconds=0.1, size=1)
    assert ctl.step_cost is not None and abs(ctl.step_cost - 0.01) < 1e-9  # plain: unchanged
    assert ctl.choose(lambda k: k + 1) == 0
    rounds = 0
    while ctl.choose(lambda k: k + 1) == 0 and rounds < 200:
        ctl.update(0, 0, draft_seconds=0.0, verify_seconds=0.1, size=1)
        rounds += 1
    assert 0 < rounds < 200 and ctl.choose(lambda k: k + 1) >= 1
    # with k_min=1 (tree depth) plain is never chosen
    ctl = AdaptiveDepth(k_min=1, k_max=8, slope=0.2)
    for _ in range(30):
        ctl.update(4, 0, draft_seconds=0.03, verify_seconds=0.18, size=5)
    assert ctl.choose(lambda k: k + 1) == 1


def test_a_round_of_k_runs_k_minus_one_head_steps_or_one_parallel_forward() -> None:
    """The first draft comes from the logits of the last commit: chain K runs K - 1 head
    steps, parallel one forward for any K >= 2; K <= 1 runs none and leaves the step cost."""
    chain, par = AdaptiveDepth(k_min=0), AdaptiveDepth(k_min=0, parallel=True)
    assert [chain.forwards(k) for k in range(5)] == [0, 0, 1, 2, 3]
    assert [par.forwards(k) for k in range(5)] == [0, 0, 1, 1, 1]
    chain.update(5, 5, draft_seconds=0.02, verify_seconds=0.1, size=6)
    par.update(5, 5, draft_seconds=0.02, verify_seconds=0.1, size=6)
    assert chain.step_cost == 0.005 and par.step_cost == 0.02
    chain.update(1, 1, draft_seconds=0.0003, verify_seconds=0.1, size=2)
    assert chain.step_cost == 0.005  # a K=1 round ran no head step


def test_parallel_k1_costs_no_draft_forward() -> None:
    """Drafts almost never accepted (a_1 = 0.1), a head forward 50 ms, verify 100 ms flat:
    K = 1 (1.1 tokens / 100 ms) beats plain (1 / 100 ms) and K = 2 (~1.11 / 150 ms); a
    verified token costing 20% makes plain the best."""
    ctl = AdaptiveDepth(k_min=0, k_max=4, parallel=True, prior_weight=1e-9)
    ctl.accepted, ctl.reached = [0.1], [1.0]
    ctl.step_cost, ctl.level, ctl.slope = 0.05, 0.1, 0.0
    assert ctl.choose(lambda k: k + 1) == 1
    ctl.slope = 0.2
    assert ctl.choose(lambda k: k + 1) == 0


def test_parallel_runs_deeper_than_chain_on_the_same_figures() -> None:
    """Same acceptance and costs: chain pays a head step per extra draft, parallel none, so
    parallel's best K is deeper."""
    def best(parallel: bool) -> int:
        ctl = AdaptiveDepth(k_max=12, parallel=parallel, slope=0.02, prior_weight=1e-9)
        ctl.accepted, ctl.reached = [0.8, 0.6, 0.5, 0.45, 0.4, 0.35, 0.3, 0.3], [1.0] * 8
        ctl.step_cost, ctl.level = 0.006, 0.04
        return ctl.choose(lambda k: k + 1)

    assert best(True) > best(False) >= 2


def test_round_overhead_favours_deeper_rounds() -> None:
    """A fixed cost per round outside drafting and verification (head extend, emit) makes
    a deeper round relatively cheaper: with it the controller picks a larger K."""
    def trained(overhead_s: float) -> int:
        ctl = AdaptiveDepth(k_max=8, slope=0.02, prior_weight=1e-9)
        ctl.accepted, ctl.reached = [0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55], [1.0] * 8
        for _ in range(10):
            ctl.update(4, 4, draft_seconds=0.012, verify_seconds=0.040, size=5)
            ctl.accepted, ctl.reached = [0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55], [1.0] * 8
            ctl.observe_round(0.052 + overhead_s)
        assert abs(ctl.overhead - overhead_s) < 1e-3
        return ctl.choose(lambda k: k + 1)

    assert trained(0.030) > trained(0.0)
