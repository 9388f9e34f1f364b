"""The job page's stage bars (api/console/stages.py) from the records the worker writes
(workers/jobs/job_metrics.py puts the labels entered in progress["stages"])."""

from __future__ import annotations

from eaglenest.api.console.stages import bars


def test_listed_stages_give_one_bar_each_and_the_rest_pending() -> None:
    progress = {"stage": "train in 2 processes", "step": 5, "total": 20,
                "stages": ["download model", "check model files", "load data",
                           "capture hidden states", "train eagle3 head on 96 samples",
                           "train in 2 processes"]}
    shown = [(b.key, b.percent, b.state) for b in bars("INPROGRESS", progress)]
    assert shown == [("download", 100, "done"), ("check", 100, "done"),
                     ("load", 100, "done"), ("capture", 100, "done"),
                     ("train", 25, "running"), ("export", 0, "pending"),
                     ("upload", 0, "pending")]


def test_a_completed_job_is_full_and_a_stopped_one_says_so() -> None:
    listed = {"stages": ["download model", "train", "benchmark baseline vs EAGLE"]}
    assert {b.percent for b in bars("COMPLETED", {**listed, "stage": "upload"})} == {100}
    stopped = bars("STOPPED", {**listed, "stage": "train", "step": 2, "total": 4})
    assert [(b.key, b.state) for b in stopped][:2] == [("download", "done"),
                                                      ("train", "stopped")]
