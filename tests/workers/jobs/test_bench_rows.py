"""Which rows a job's benchmark measures and in how many rounds (workers/jobs/bench_rows.py,
the decodings from workers/jobs/options.py ``bench_decodings``): a row per decoding and K by
head kind and backend; rounds that go on while a watched row's pooled figure is unsteady (the leading row, the
baseline, the fastest row),
up to the most rounds and within the stage's budget, with progress totals that grow with
them; a bad EAGLENEST_BENCH_DECODINGS refused naming the variable and the valid names."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from eaglenest.workers.jobs import bench_stage
from eaglenest.workers.jobs.bench_rows import (
    Row,
    leading,
    plan_rows,
    pooled_spread,
    requests_per_round,
    spread,
    unsteadiest,
    watched,
)
from eaglenest.workers.jobs.bench_stage import BenchPlan, measure_rows
from eaglenest.workers.jobs.options import OptionError, bench_decodings, for_kind, parse_options
from eaglenest.workers.jobs.progress import BenchProgress
from tests.workers.jobs.test_bench_stage import Clock, FakeServer, result


def rows_of(env: dict[str, str], kind: str, backend: str) -> list[str]:
    opts = for_kind(parse_options({"EAGLENEST_HEAD": kind, **env}), kind)
    return [r.name for r in plan_rows(bench_decodings(opts, kind, backend),
                                      opts.measured_ks())]


def test_rows_per_decoding_and_k_by_head_kind_and_backend() -> None:
    """Embedded: the kind's default mode at every K, then each other decoding the head can
    run at the largest K; vLLM: its own method only."""
    assert rows_of({}, "eagle3", "embedded") == [
        "chain K=1", "chain K=3", "chain K=5", "tree K=5", "chain+adaptive K=5"]
    assert rows_of({}, "peagle", "embedded") == [
        "parallel K=1", "parallel K=3", "parallel K=5", "tree K=5", "parallel+adaptive K=5",
        "chain K=5"]
    assert rows_of({"EAGLENEST_DFLASH_BLOCK_SIZE": "8"}, "dflash", "embedded") == [
        "block K=1", "block K=3", "block K=5", "block K=7", "block+adaptive K=7"]
    assert rows_of({}, "eagle3", "vllm") == ["chain K=1", "chain K=3", "chain K=5"]
    assert rows_of({}, "peagle", "vllm") == ["parallel K=1", "parallel K=3", "parallel K=5"]
    assert rows_of({}, "dflash", "vllm") == ["block K=1", "block K=3", "block K=5", "block K=7"]
    # asked for: the first at every K, the others at the largest, in the order given
    asked = {"EAGLENEST_BENCH_DECODINGS": "tree, chain+adaptive,tree", "EAGLENEST_BENCH_KS": "2,4"}
    assert rows_of(asked, "eagle3", "embedded") == ["tree K=2", "tree K=4",
                                                    "chain+adaptive K=4"]
    assert Row("chain+adaptive", 4).log_stem == "chain-adaptive-k4-server"


@pytest.mark.parametrize(("env", "message"), [
    ({"EAGLENEST_BENCH_DECODINGS": "chain,treee"},
     "EAGLENEST_BENCH_DECODINGS: unknown decoding 'treee'; valid: chain, chain+adaptive, tree, "
     "tree+adaptive, parallel, parallel+adaptive, block, block+adaptive"),
    ({"EAGLENEST_BENCH_DECODINGS": "plain"},
     "EAGLENEST_BENCH_DECODINGS: unknown decoding 'plain'; valid: chain, chain+adaptive, tree, "
     "tree+adaptive, parallel, parallel+adaptive, block, block+adaptive"),
    ({"EAGLENEST_BENCH_DECODINGS": " , "},
     "EAGLENEST_BENCH_DECODINGS must list decodings, e.g. chain,tree"),
    ({"EAGLENEST_BENCH_DECODINGS": "chain,parallel", "EAGLENEST_HEAD": "eagle3"},
     "EAGLENEST_BENCH_DECODINGS=chain,parallel: parallel drafting needs a head with mask "
     "slots (HeadSpec.parallel); EAGLE-3 heads have none"),
    ({"EAGLENEST_BENCH_DECODINGS": "tree", "EAGLENEST_HEAD": "dflash"},
     "EAGLENEST_BENCH_DECODINGS=tree: DFlash heads draft a block per forward: tree drafting "
     "is not theirs (use block)"),
    ({"EAGLENEST_BENCH_DECODINGS": "chain,tree", "EAGLENEST_HEAD": "eagle3",
      "EAGLENEST_SERVING_BACKEND": "vllm"},
     "EAGLENEST_BENCH_DECODINGS=chain,tree: the vllm backend serves one decoding, the head's "
     "own (chain), not tree"),
])
def test_bad_decodings_name_the_variable_and_the_valid_names(env: dict[str, str],
                                                             message: str) -> None:
    """What the worker's parser raises is the job's FailureReason as it stands."""
    with pytest.raises(OptionError) as exc:
        parse_options(env)
    assert str(exc.value) == message


def test_spread_pooled_spread_and_the_leading_row() -> None:
    assert spread([95.0, 105.0]) == pytest.approx(0.1)
    assert pooled_spread([95.0, 105.0]) == pytest.approx(0.1)  # two rounds: the spread
    assert spread([95.0, 105.0, 100.0, 100.0]) == pytest.approx(0.1)  # a range only grows
    assert pooled_spread([95.0, 105.0, 100.0, 100.0]) == pytest.approx(0.0408, abs=1e-4)
    assert spread([100.0]) == pooled_spread([100.0]) == 0.0
    assert requests_per_round(8, 1) == requests_per_round(8, 8) == 8
    assert requests_per_round(8, 12) == requests_per_round(8, 16) == 16
    rows = [Row("chain", 3), Row("tree", 5)]
    # the fastest of those beating the baseline by 5% in every round; none: the baseline
    assert leading({"baseline": [100, 100], "chain K=3": [120, 120], "tree K=5": [150, 104]},
                   rows) == "chain K=3"
    assert leading({"baseline": [100, 100], "chain K=3": [104, 120], "tree K=5": [90, 90]},
                   rows) == "baseline"
    # watched: the leading row, the baseline, the fastest by mean; the unsteadiest of them
    rates = {"baseline": [100, 100], "chain K=3": [104, 120], "tree K=5": [90, 90]}
    assert watched(rates, rows) == ["baseline", "chain K=3"]
    assert unsteadiest(rates, rows) == ("chain K=3", pytest.approx(16 / 112))
    rates = {"baseline": [100, 100], "chain K=3": [120, 121], "tree K=5": [150, 104]}
    assert watched(rates, rows) == ["chain K=3", "baseline", "tree K=5"]
    assert unsteadiest(rates, rows)[0] == "tree K=5"
    assert watched({"baseline": [100, 90]}, rows) == ["baseline"]


Rates = Callable[[str, int, int], float]  # (server log stem, concurrency, round) -> tok/s


def scripted(monkeypatch, rates: Rates,  # noqa: ANN001
             seconds: Callable[[int], float] = lambda c: 10.0) -> Clock:
    """Fake servers whose tok/s follows ``rates`` round by round; each measurement at
    concurrency c takes ``seconds(c)`` on the returned clock (the stage's budget is read on
    it)."""
    clock = Clock()
    rounds: dict[tuple[str, int], int] = {}

    def server(plan, head, k, log_path, sharing, decoding=None):  # noqa: ANN001
        return FakeServer(log_path.stem)

    def measure(srv, plan, c):  # noqa: ANN001
        r = rounds[srv.name, c] = rounds.get((srv.name, c), -1) + 1
        clock.t += seconds(c)
        return result(c, requests_per_round(len(plan.prompts), c), rates(srv.name, c, r))

    monkeypatch.setattr(bench_stage, "_server", server)
    monkeypatch.setattr(bench_stage, "_measure", measure)
    monkeypatch.setattr(bench_stage, "_warm_up", lambda server, plan: None)
    return clock


def noisy_at_1(name: str, c: int, r: int) -> float:
    """The baseline steady at 100; chain K=3 at 120, but at concurrency 1 its first two
    rounds 114 and 126 (10% apart), then 120."""
    if name.startswith("baseline"):
        return 100.0
    return (114.0, 126.0)[r] if c == 1 and r < 2 else 120.0


def sizing_plan(**kw) -> BenchPlan:  # noqa: ANN003
    return BenchPlan(Path("model"), Path("head"), ["p"] * 4, "embedded", (1, 4), 8, 3,
                     ks=(3,), **{"rounds": 2, "max_rounds": 6, **kw})


def test_a_spread_row_gets_rounds_until_steady_and_a_steady_one_stops_at_bench_rounds(
        monkeypatch, caplog, tmp_path):
    """Every level's 2 rounds first; then concurrency 1, where chain K=3 leads with rounds
    10% apart, gets round 3 (pooled spread 10%), then round 4 (5.8%), then none (4.1% <
    5%); concurrency 4 is steady: its 2 rounds. The requests total grows by a round of both
    rows each time."""
    clock = scripted(monkeypatch, noisy_at_1)
    reports: list = []
    caplog.set_level(logging.INFO, logger="eaglenest.optimize")
    rows = measure_rows(sizing_plan(), tmp_path, lambda: False,
                        BenchProgress("j1", "benchmark", reports.append, clock))
    assert {name: [len(level) for level in levels] for name, levels in rows.items()} == {
        "baseline": [4, 2], "chain K=3": [4, 2]}
    assert [r.output_throughput for r in rows["chain K=3"][0]] == [114.0, 126.0, 120.0, 120.0]
    lines = [r.getMessage() for r in caplog.records]
    added = [line for line in lines if "added" in line]
    assert added == [
        "job j1: benchmark: concurrency 1 (level 1/2)  round 3 added: chain K=3 pooled spread "
        "10.0%  requests 32/40 (80%)",
        "job j1: benchmark: concurrency 1 (level 1/2)  round 4 added: chain K=3 pooled spread "
        "5.8%  requests 40/48 (83%)"]
    # concurrency 4's rounds came before them
    assert lines[lines.index(added[0]) - 1].startswith(
        "job j1: benchmark: concurrency 4 (level 2/2)  baseline (embedded)  round 2/2")
    assert lines[lines.index(added[1]) + 1] == (  # round 4, rows reversed as in round 2
        "job j1: benchmark: concurrency 1 (level 1/2)  chain K=3 (embedded)  round 4/4  "
        "120.0 tok/s  requests 44/48 (91%)  ETA 10s")
    assert lines[-1] == ("job j1: benchmark: concurrency 1 (level 1/2)  baseline (embedded)  "
                         "round 4/4  100.0 tok/s  requests 48/48 (100%)  ETA 0s")
    assert reports[-1]["requests"] == reports[-1]["requests_total"] == 48


def test_a_spread_row_within_the_margin_gets_rounds_while_the_baseline_leads(
        monkeypatch, caplog, tmp_path):
    """Concurrency 1: chain K=3's first rounds 104 and 124 against a steady baseline of 100,
    so the baseline leads (104 is within the 5% margin) while chain K=3, the fastest row,
    spreads 17.5%: rounds are added for it (114 each) until its pooled figure is under 5%
    after round 6, though the baseline still leads."""
    def within_margin(name: str, c: int, r: int) -> float:
        if name.startswith("baseline"):
            return 100.0
        return (104.0, 124.0)[r] if c == 1 and r < 2 else 114.0

    scripted(monkeypatch, within_margin)
    caplog.set_level(logging.INFO, logger="eaglenest.optimize")
    rows = measure_rows(sizing_plan(), tmp_path, lambda: False,
                        BenchProgress("j1", "benchmark", lambda _: None, Clock()))
    assert [len(level) for level in rows["chain K=3"]] == [6, 2]
    added = [r.getMessage() for r in caplog.records if "added" in r.getMessage()]
    assert [line.split("  ")[1] for line in added] == [
        "round 3 added: chain K=3 pooled spread 17.5%",
        "round 4 added: chain K=3 pooled spread 10.1%",
        "round 5 added: chain K=3 pooled spread 7.2%",
        "round 6 added: chain K=3 pooled spread 5.5%"]
    rates = {n: [r.output_throughput for r in levels[0]] for n, levels in rows.items()}
    assert leading(rates, [Row("chain", 3)]) == "baseline"  # 104 stays within the margin
    assert unsteadiest(rates, [Row("chain", 3)])[1] < 0.05


def test_rounds_stop_at_the_most_and_within_the_budget(monkeypatch, tmp_path):
    """A leading row that keeps spreading (108, 132, 108, ...) gets rounds up to
    max_rounds; with a budget, only the rounds that fit it, each priced at its own level's
    pace: a round is 2 rows x 10 s, every level's 2 rounds take 80 s, so at concurrency 1 a
    third fits a 105 s budget (80 + 20 = 100 s) and a fourth does not (120 s). Where a round
    at 4 takes 2 rows x 2 s, the 2 rounds of both levels take 48 s and two more at 1 fit a
    90 s budget (88 s): the rounds at 4 are not priced at 1's pace."""
    def unsteady(name: str, c: int, r: int) -> float:
        return 100.0 if name.startswith("baseline") or c == 4 else (108.0, 132.0)[r % 2]

    scripted(monkeypatch, unsteady)
    rows = measure_rows(sizing_plan(max_rounds=5), tmp_path, lambda: False,
                        BenchProgress(None, "benchmark", lambda _: None, Clock()))
    assert [len(level) for level in rows["chain K=3"]] == [5, 2]

    clock = scripted(monkeypatch, unsteady)
    reports: list = []
    rows = measure_rows(sizing_plan(minutes=1.75), tmp_path, lambda: False,
                        BenchProgress(None, "benchmark", reports.append, clock))
    assert [len(level) for level in rows["chain K=3"]] == [3, 2]
    assert clock.t == 100.0 and reports[-1]["requests"] == reports[-1]["requests_total"]
    rows = measure_rows(sizing_plan(minutes=1.75, max_rounds=2), tmp_path, lambda: False,
                        BenchProgress(None, "benchmark", lambda _: None, clock))
    assert [len(level) for level in rows["chain K=3"]] == [2, 2]  # max_rounds = rounds

    clock = scripted(monkeypatch, unsteady, seconds=lambda c: 10.0 if c == 1 else 2.0)
    rows = measure_rows(sizing_plan(minutes=1.5), tmp_path, lambda: False,
                        BenchProgress(None, "benchmark", lambda _: None, clock))
    assert [len(level) for level in rows["chain K=3"]] == [4, 2]
    assert clock.t == 88.0


def test_on_gpus_a_round_more_covers_only_the_unsteady_levels(monkeypatch, tmp_path):
    """One server at a time: after the 2 rounds of every level, round 3 and 4 start every
    row's server again but measure only concurrency 1, where the rounds still spread."""
    clock = scripted(monkeypatch, noisy_at_1)
    starts: list = []
    progress = BenchProgress(None, "benchmark", starts.append, clock)
    rows = measure_rows(sizing_plan(gpus=[0]), tmp_path, lambda: False, progress)
    assert {name: [len(level) for level in levels] for name, levels in rows.items()} == {
        "baseline": [4, 2], "chain K=3": [4, 2]}
    started = [(r["row"], r["server"], r["servers"]) for r in starts if r["phase"] == "starting"]
    assert started == [("baseline", 1, 4), ("chain K=3", 2, 4), ("chain K=3", 3, 4),
                       ("baseline", 4, 4), ("baseline", 5, 6), ("chain K=3", 6, 6),
                       ("chain K=3", 7, 8), ("baseline", 8, 8)]
    assert starts[-1]["requests"] == starts[-1]["requests_total"] == 4 * 2 * 4 + 4 * 2 * 2
