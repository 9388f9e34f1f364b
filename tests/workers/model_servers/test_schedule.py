"""The speculation schedule: derived from measured tok/s of (decoding, K) rows with a 5%
margin in every round, never deeper with load, looked up by the number of running requests,
parsed with errors naming their source, mapped onto vLLM's batch-size ranges."""

from __future__ import annotations

import pytest

from eaglenest.workers.jobs.loadgen import LevelResult, pool
from eaglenest.workers.model_servers.schedule import (
    Schedule,
    ScheduleError,
    Threshold,
    derive,
    parse_schedule,
)


def chain(by_k: dict[int, dict[int, float]]) -> dict[tuple[str, int], dict[int, float]]:
    """Chain rows keyed as derive wants them: (decoding, K)."""
    return {("chain", k): rates for k, rates in by_k.items()}  # type: ignore[misc]


def test_derive_picks_the_best_k_only_beyond_the_margin() -> None:
    baseline = {1: 10.0, 2: 18.0, 4: 30.0, 8: 50.0, 16: 60.0}
    by_k = {1: {1: 14.0, 2: 20.0, 4: 31.6, 8: 45.0, 16: 50.0},
            3: {1: 18.0, 2: 25.0, 4: 30.5, 8: 40.0, 16: 40.0},
            5: {1: 19.0, 2: 24.0, 4: 30.0, 8: 35.0, 16: 30.0}}
    schedule, chosen = derive(baseline, chain(by_k))
    # c=4: K=1 gives 31.6 > 31.5 (baseline + 5%): chosen; c=8, 16: no K wins
    assert chosen == {1: ("chain", 5), 2: ("chain", 3), 4: ("chain", 1), 8: ("plain", 0),
                      16: ("plain", 0)}
    assert schedule.to_list() == [[1, 5, "chain"], [2, 3, "chain"], [4, 1, "chain"], [16, 0]]
    by_k[1][4] = 31.4  # within the margin now: off at 4
    assert derive(baseline, chain(by_k))[0].to_list() == [[1, 5, "chain"], [2, 3, "chain"],
                                                          [16, 0]]


def test_derive_keeps_speculation_off_above_a_level_where_it_lost() -> None:
    # measured on the embedded server (2026-11-26): K=1 wins at 8, K=3 at 16 by 20%; a
    # schedule never goes deeper with load, so 16 may only use K <= 1, which loses there
    baseline = {1: 11.6, 2: 18.8, 4: 34.0, 8: 43.2, 16: 48.3}
    by_k = {1: {1: 17.0, 2: 33.2, 4: 42.7, 8: 51.3, 16: 49.6},
            3: {1: 26.7, 2: 39.3, 4: 47.6, 8: 50.5, 16: 58.2},
            5: {1: 26.8, 2: 35.1, 4: 39.1, 8: 46.1, 16: 52.9}}
    schedule, chosen = derive(baseline, chain(by_k))
    assert {c: k for c, (_, k) in chosen.items()} == {1: 5, 2: 3, 4: 3, 8: 1, 16: 0}
    assert schedule.to_list() == [[1, 5, "chain"], [4, 3, "chain"], [8, 1, "chain"], [16, 0]]
    # off at 4 (every K within the margin) keeps 8 and 16 off whatever they measured
    by_k[1][4] = by_k[3][4] = by_k[5][4] = 35.0
    assert {c: k for c, (_, k) in derive(baseline, chain(by_k))[1].items()} == {
        1: 5, 2: 3, 4: 0, 8: 0, 16: 0}


def test_derive_needs_the_win_in_every_round() -> None:
    baseline = {1: [10.0, 12.0], 4: [30.0, 26.0]}
    by_k = {1: {1: [14.0, 15.0], 4: [33.0, 31.0]},
            3: {1: [19.0, 12.5], 4: [40.0, 27.0]}}
    # K=3 at 1: 12.5 in round 2 is within 5% of that round's 12.0 -> K=1 (mean 14.5);
    # at 4: K=3 loses round 2 (27 <= 27.3), K=1 wins both (33 > 31.5, 31 > 27.3)
    schedule, chosen = derive(baseline, chain(by_k))  # type: ignore[arg-type]
    assert chosen == {1: ("chain", 1), 4: ("chain", 1)}
    assert schedule.to_list() == [[4, 1, "chain"]]
    by_k[3][1] = [19.0, 13.0]  # wins both rounds now, with the higher mean
    assert derive(baseline, chain(by_k))[1] == {1: ("chain", 3), 4: ("chain", 1)}  # type: ignore[arg-type]
    assert derive({1: [10.0]}, {("chain", 3): {1: [10.4]}})[1] == {1: ("plain", 0)}


def test_derive_chooses_the_decoding_per_level() -> None:
    # a stand-in server whose tree row is fastest alone and chain's at 4 gets tree then chain
    baseline = {1: 10.0, 4: 30.0, 8: 40.0}
    rows = {("tree", 4): {1: 20.0, 4: 33.0, 8: 41.0},
            ("chain", 4): {1: 18.0, 4: 34.0, 8: 43.0},
            ("chain+adaptive", 4): {1: 19.0, 4: 32.0, 8: 42.5}}
    schedule, chosen = derive(baseline, rows)
    assert chosen == {1: ("tree", 4), 4: ("chain", 4), 8: ("chain", 4)}
    assert schedule.to_list() == [[1, 4, "tree"], [8, 4, "chain"]]
    assert schedule.decodings == ("tree", "chain")
    assert [schedule.decoding_for(n) for n in (1, 2, 8, 9)] == ["tree", "chain", "chain",
                                                                 "chain"]


def test_derive_caps_k_across_decodings() -> None:
    # chain K=2 wins at 4, so 8 may only use K <= 2 in any decoding: tree depth 5 is out
    # although it measured fastest there
    baseline = {1: 10.0, 4: 30.0, 8: 40.0}
    rows = {("tree", 5): {1: 20.0, 4: 33.0, 8: 60.0},
            ("chain", 2): {1: 15.0, 4: 36.0, 8: 44.0},
            ("parallel", 3): {1: 16.0, 4: 35.0, 8: 50.0}}
    schedule, chosen = derive(baseline, rows)
    assert chosen == {1: ("tree", 5), 4: ("chain", 2), 8: ("chain", 2)}
    assert schedule.to_list() == [[1, 5, "tree"], [8, 2, "chain"]]
    rows[("chain", 2)][8] = 41.0  # within the margin: nothing at K <= 2 wins, off at 8
    assert derive(baseline, rows)[0].to_list() == [[1, 5, "tree"], [4, 2, "chain"], [8, 0]]


def test_pooled_rounds_add_up_counts_and_keep_the_worst_tail() -> None:
    def level(tokens: int, seconds: float, p50: float, p99: float) -> LevelResult:
        return LevelResult(concurrency=4, requests=8, duration_s=seconds, ttft_ms_p50=p50,
                           ttft_ms_p90=p99, tpot_ms_p50=p50, itl_ms_p50=p50, e2e_ms_p50=p50,
                           request_throughput=8 / seconds, output_throughput=tokens / seconds,
                           otps_per_request=10.0, output_tokens=tokens, acceptance_length=2.0,
                           drafts=10.0, accepted=10.0, ttft_ms_p99=p99, tpot_ms_p99=p99)

    pooled = pool([level(100, 2.0, 50.0, 80.0), level(100, 3.0, 70.0, 90.0),
                   level(100, 5.0, 60.0, 300.0)])
    assert pooled.output_throughput == 30.0  # 300 tokens in 10 s, not the mean of 50/33/20
    assert pooled.requests == 24 and pooled.request_throughput == 2.4
    assert pooled.ttft_ms_p50 == 60.0 and pooled.ttft_ms_p99 == 300.0
    assert pooled.acceptance_length == 2.0 and pooled.drafts == 30.0


def test_lookup_between_and_beyond_the_measured_levels() -> None:
    s = Schedule(((1, 5), (4, 3), (16, 0)))
    assert [s.k_for(n) for n in (1, 2, 3, 4, 5, 16, 17, 100)] == [5, 3, 3, 3, 0, 0, 0, 0]
    assert s.k_max == 5 and s.speculates
    assert not Schedule(((8, 0),)).speculates


def test_vllm_ranges_cover_every_batch_size_from_one() -> None:
    s = Schedule(((1, 5), (4, 3), (16, 0)))
    assert s.vllm_ranges() == [[1, 1, 5], [2, 4, 3], [5, 4096, 0]]
    assert Schedule(((8, 2),)).vllm_ranges() == [[1, 4096, 2]]


def test_speculate_upto_is_where_speculation_ends_for_good() -> None:
    assert Schedule(((2, 3), (16, 0))).speculate_upto == 2
    assert Schedule(((1, 5), (4, 3), (16, 0))).speculate_upto == 4
    assert Schedule(((1, 5), (4, 3))).speculate_upto is None  # on at every load
    assert Schedule(((4, 0),)).speculate_upto is None  # never on


def test_parse_round_trips_the_environment_value() -> None:
    s = Schedule(((1, 5), (4, 3), (16, 0)))
    assert s.to_env() == "[[1,5],[4,3],[16,0]]"
    assert parse_schedule(s.to_env()) == s
    assert parse_schedule('{"thresholds": [[2, 3]]}').thresholds == (Threshold(2, 3, None),)
    assert s.decodings == () and s.decoding_for(1) is None


def test_decodings_parse_and_round_trip() -> None:
    raw = '[[1,4,"tree+adaptive"],[4,3,"chain"],[16,0]]'
    s = parse_schedule(raw)
    assert s.thresholds == (Threshold(1, 4, "tree+adaptive"), Threshold(4, 3, "chain"),
                            Threshold(16, 0, None))
    assert s.to_env() == raw and parse_schedule(s.to_env()) == s
    assert [(s.k_for(n), s.decoding_for(n)) for n in (1, 2, 4, 5, 99)] == [
        (4, "tree+adaptive"), (3, "chain"), (3, "chain"), (0, None), (0, None)]
    # vLLM serves its own method: the ranges carry K only
    assert s.vllm_ranges() == [[1, 1, 4], [2, 4, 3], [5, 4096, 0]]
    # two- and three-element entries mix; a plain tuple entry is a Threshold
    assert parse_schedule('[[1,3,"tree"],[8,2]]') == Schedule(((1, 3, "tree"), (8, 2)))


@pytest.mark.parametrize(("raw", "message"), [
    ("K=3", "EAGLENEST_SPECULATION_SCHEDULE='K=3' is not JSON; expected a list of "
            '[max_running, K(, decoding)] entries, e.g. [[1,4,"tree"],[4,3,"chain"],[16,0]]'),
    ("[]", "EAGLENEST_SPECULATION_SCHEDULE must be a list of 1 to 64 [max_running, K] or "
           '[max_running, K, "decoding"] entries, e.g. [[1,4,"tree"],[4,3,"chain"],[16,0]]'),
    ("[[1, 2, 3]]", "EAGLENEST_SPECULATION_SCHEDULE: [1, 2, 3] is not a [max_running, K] pair "
                    'of integers or a [max_running, K, "decoding"] triple'),
    ("[[1, 2.5]]", "EAGLENEST_SPECULATION_SCHEDULE: [1, 2.5] is not a [max_running, K] pair "
                   'of integers or a [max_running, K, "decoding"] triple'),
    ('[[1, 2, "tree", 4]]', 'EAGLENEST_SPECULATION_SCHEDULE: [1, 2, "tree", 4] is not a '
                            '[max_running, K] pair of integers or a [max_running, K, '
                            '"decoding"] triple'),
    ('[[1, 3, "beam"]]', 'EAGLENEST_SPECULATION_SCHEDULE: [1, 3, "beam"] names an unknown '
                         "decoding 'beam'; valid: chain, chain+adaptive, tree, tree+adaptive, "
                         "parallel, parallel+adaptive, block, block+adaptive"),
    ('[[1, 3, "plain"]]', 'EAGLENEST_SPECULATION_SCHEDULE: [1, 3, "plain"] names an unknown '
                          "decoding 'plain'; valid: chain, chain+adaptive, tree, "
                          "tree+adaptive, parallel, parallel+adaptive, block, block+adaptive"),
    ('[[1, 0, "tree"]]', 'EAGLENEST_SPECULATION_SCHEDULE: [1, 0, "tree"] is off (K = 0) and '
                         "so has no decoding: write [1, 0]"),
    ("[[0, 3]]", "EAGLENEST_SPECULATION_SCHEDULE: [0, 3] needs max_running >= 1 and "
                 "0 <= K <= 64"),
    ("[[1, 65]]", "EAGLENEST_SPECULATION_SCHEDULE: [1, 65] needs max_running >= 1 and "
                  "0 <= K <= 64"),
    ("[[4, 3], [2, 0]]", "EAGLENEST_SPECULATION_SCHEDULE: max_running must increase from "
                         "entry to entry (4 then 2)"),
])
def test_bad_schedules_name_the_variable(raw: str, message: str) -> None:
    with pytest.raises(ScheduleError) as exc:
        parse_schedule(raw)
    assert str(exc.value) == message
