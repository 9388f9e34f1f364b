"""benchmarks/readme_levers.py's own logic (the jobs themselves run only as the benchmark):
lever names, the arguments it refuses, and the row it reads from a job's outputs."""

from __future__ import annotations

import datetime as dt
import io
import json
from typing import Any

import pytest

from benchmarks import readme_levers as levers
from eaglenest.foundation.job_options import parse_job_options


def test_every_levers_options_are_valid_job_options() -> None:
    for name, (options, data, start) in levers.LEVERS.items():
        parse_job_options({**levers.BENCH, **options})  # raises on a bad one
        assert data in ("mine", "builtin") and start in (None, *levers.LEVERS), name
    assert levers.job_name("job 3 from readme") == "lever-job-3-from-readme"


@pytest.mark.parametrize(("only", "message"), [
    ("readme,nope", "unknown levers ['nope']"),
    ("job 3 from readme", "['readme'] must run first"),
])
def test_bad_choices_are_refused_before_anything_starts(only, message, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        levers.main(["--only", only])
    assert exc.value.code == 2 and message in capsys.readouterr().err


class FakeS3:
    def __init__(self, files: dict[str, Any]) -> None:
        self.files = files

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803
        assert Bucket == "output"
        return {"Body": io.BytesIO(json.dumps(self.files[Key]).encode())}


def test_a_jobs_row_comes_from_its_provenance_and_benchmark() -> None:
    name = levers.job_name("ttt 4")
    train = {"steps": 410, "seconds": 480.0, "stop_reason": "time budget",
             "heldout_accuracy": [0.61, 0.42, 0.3, 0.2]}
    measured = {"output_throughput": {"baseline": {"1": 50.0}, "chain K=3": {"1": 80.0}},
                "pooled_spread": {"chain K=3": {"1": 0.031}}}
    report = {"schedule": {"measured": measured}, "results": {"chain K=3": [
        {"concurrency": 1, "acceptance_length": 2.25}]}}
    s3 = FakeS3({f"{name}/provenance.json": {"train": train},
                 f"{name}/benchmark.json": report})
    start = dt.datetime(2026, 11, 29, 20, 0)
    row = levers.figures(s3, "ttt 4", {"OptimizationStartTime": start,
                                       "OptimizationEndTime": start + dt.timedelta(minutes=15)})
    assert row["ratio"] == 1.6 and row["heldout"] == [0.61, 0.42, 0.3]
    assert (row["tau"], row["job_minutes"], row["train_minutes"]) == (2.25, 15.0, 8.0)
    text = levers.table([row])
    assert ("| ttt 4 | TTT_STEPS=4 | 410 | 8.0 | time budget | 0.610 / 0.420 / 0.300 | 2.25 "
            "| 50.0 | 80.0 | 1.60x (3.1%) | 15.0 |") in text


def test_the_readme_lever_is_the_readmes_options() -> None:
    options = levers.readme_options()
    assert options["EAGLENEST_MAX_TRAIN_MINUTES"] == "8"
    parse_job_options({**options, **levers.BENCH})
    assert options["EAGLENEST_DRAFT_VOCAB_SIZE"] == "2048"
    text = 'x\nOPTIONS = {"A": "1",\n           "B": "2"}  # job options\nY = {}\n'
    assert levers.readme_options(text) == {"A": "1", "B": "2"}
