"""The benchmark's job options as CreateOptimizationJob reads them (foundation/job_options.py
check_create): EAGLENEST_BENCH_MAX_ROUNDS and EAGLENEST_BENCH_MINUTES checked like the
others, naming the variable; EAGLENEST_BENCH_DECODINGS read as a list of names whose
decodings the worker checks (the control plane does not import models/: the names and the
head's refusal are tests/workers/jobs/test_bench_rows.py's)."""

from __future__ import annotations

import pytest

from eaglenest.foundation.job_options import OptionError, check_create, parse_job_options

WHERE = "OptimizationEnvironment"


def create(**env: str):  # noqa: ANN201
    return check_create(env, WHERE, 2, 1, "ml.g5.xlarge")


def test_defaults_and_values() -> None:
    opts = parse_job_options({})
    assert (opts.bench_rounds, opts.bench_max_rounds, opts.bench_minutes) == (2, 6, 10.0)
    assert opts.bench_decodings is None  # by head kind and backend, in the worker
    opts = create(EAGLENEST_BENCH_MAX_ROUNDS="3", EAGLENEST_BENCH_MINUTES="2.5",
                  EAGLENEST_BENCH_DECODINGS=" tree,chain+adaptive , tree,")
    assert (opts.bench_max_rounds, opts.bench_minutes) == (3, 2.5)
    assert opts.bench_decodings == ("tree", "chain+adaptive")  # once each, in order
    # more rounds asked at least than at most: the least wins only when the most is unset
    assert create(EAGLENEST_BENCH_ROUNDS="8").bench_max_rounds == 6


@pytest.mark.parametrize(("env", "message"), [
    ({"EAGLENEST_BENCH_MAX_ROUNDS": "0"}, "EAGLENEST_BENCH_MAX_ROUNDS=0 must be between 1 and 20"),
    ({"EAGLENEST_BENCH_MAX_ROUNDS": "21"},
     "EAGLENEST_BENCH_MAX_ROUNDS=21 must be between 1 and 20"),
    ({"EAGLENEST_BENCH_MAX_ROUNDS": "many"},
     "EAGLENEST_BENCH_MAX_ROUNDS='many' is not an integer"),
    ({"EAGLENEST_BENCH_ROUNDS": "4", "EAGLENEST_BENCH_MAX_ROUNDS": "3"},
     "EAGLENEST_BENCH_MAX_ROUNDS=3 is below EAGLENEST_BENCH_ROUNDS=4"),
    ({"EAGLENEST_BENCH_MINUTES": "-1"},
     "EAGLENEST_BENCH_MINUTES='-1' must be minutes between 0 (no budget) and 525600"),
    ({"EAGLENEST_BENCH_MINUTES": "nan"}, "EAGLENEST_BENCH_MINUTES='nan' is not a finite number"),
    ({"EAGLENEST_BENCH_DECODINGS": ","},
     "EAGLENEST_BENCH_DECODINGS must list decodings, e.g. chain,tree"),
])
def test_bad_values_are_refused_at_create_naming_the_variable(env: dict[str, str],
                                                              message: str) -> None:
    with pytest.raises(OptionError) as exc:
        create(**env)
    assert str(exc.value) == (f"{WHERE}: {message} (EagleNest's limits: "
                              "docs/configuration.md).")
