"""TrainingProgress (workers/jobs/progress.py): every N steps and at the last one a log line
with step/total, loss, training accuracy (labelled so), tokens/s and ETA, a progress record
for `eaglenest status`, and training_log.jsonl (rows with timestamps) uploaded to the output
prefix; a resumed job keeps the rows published before its checkpoint; a store outage costs
an upload, not the job. BenchProgress: a line per server start and per measured row, a
record before and after each measurement, requests done/total and an ETA."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from eaglenest.cli.status import progress_line
from eaglenest.foundation.store.storage import LocalStore, StorageError, parse_uri
from eaglenest.workers.jobs.progress import BenchProgress, TrainingProgress, describe

URI = "s3://output/jobs/j1/training_log.jsonl"


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def row(step: int) -> dict:
    return {"step": step, "loss": 5.0 / step, "lr": 1e-3, "accuracy": [0.5, 0.25],
            "tokens": 300, "ts": f"2026-11-26T10:00:{step:02d}.000Z"}


def make(tmp_path: Path, store, reports: list, clock: Clock, total: int = 10,
         every: int = 4) -> TrainingProgress:
    return TrainingProgress("j1", "train eagle3 head on 40 samples", total, every, store, URI,
                            tmp_path / "work" / "training_log.jsonl", reports.append, clock)


def published(store: LocalStore) -> list[int]:
    data = store.get_bytes(parse_uri(URI)).decode()
    return [json.loads(line)["step"] for line in data.splitlines()]


def test_every_n_steps_and_the_last(tmp_path, caplog):
    store, reports, clock = LocalStore(tmp_path / "s3"), [], Clock()
    progress = make(tmp_path, store, reports, clock)
    caplog.set_level(logging.INFO, logger="eaglenest.optimize")
    for step in range(1, 4):
        clock.t += 2.0
        progress.row(row(step))
    assert reports == [] and not caplog.records
    with pytest.raises(StorageError):
        store.get_bytes(parse_uri(URI))
    clock.t += 2.0
    progress.row(row(4))  # 4 steps in 8 s, 1200 tokens
    assert published(store) == [1, 2, 3, 4]
    first = reports[-1]
    assert first["stage"] == "train eagle3 head on 40 samples"
    assert (first["step"], first["total"], first["loss"]) == (4, 10, 1.25)
    assert first["tokens_per_second"] == pytest.approx(150.0)
    assert first["eta_seconds"] == pytest.approx(12.0)  # 6 steps left at 2 s each
    assert caplog.records[-1].getMessage() == (
        "job j1: step 4/10 (40%)  loss 1.250  train acc@1/2 0.50/0.25  150 tokens/s  ETA 12s")
    for step in range(5, 11):
        clock.t += 1.0
        progress.row(row(step))
    assert [r["step"] for r in reports] == [4, 8, 10]
    assert reports[-1]["eta_seconds"] == 0 and published(store) == list(range(1, 11))
    progress.finish()  # the last step was reported already
    assert len(reports) == 3
    rows = store.get_bytes(parse_uri(URI)).decode().splitlines()
    assert all(json.loads(line)["ts"].endswith("Z") for line in rows)


def test_finish_reports_a_last_step_off_the_cadence(tmp_path):
    store, reports, clock = LocalStore(tmp_path / "s3"), [], Clock()
    progress = make(tmp_path, store, reports, clock, total=100)
    for step in range(1, 7):  # stopped early (stop_after, max runtime): no step 8
        progress.row(row(step))
    progress.finish()
    assert [r["step"] for r in reports] == [4, 6]
    assert published(store) == [1, 2, 3, 4, 5, 6]


def test_resume_keeps_the_rows_published_before_its_step(tmp_path):
    store, reports, clock = LocalStore(tmp_path / "s3"), [], Clock()
    first = make(tmp_path, store, reports, clock)
    for step in range(1, 9):
        first.row(row(step))
    assert published(store) == list(range(1, 9))
    again = make(tmp_path, store, reports, clock)  # resumed from the step-6 checkpoint
    again.row(row(7))
    again.row(row(8))
    assert published(store) == list(range(1, 9))
    assert reports[-1]["step"] == 8


class BrokenStore(LocalStore):
    def put_file(self, uri, path):  # noqa: ANN001
        raise OSError("connection reset")


def test_a_store_outage_loses_an_upload_not_the_job(tmp_path, caplog):
    reports: list = []
    progress = make(tmp_path, BrokenStore(tmp_path / "s3"), reports, Clock())
    for step in range(1, 5):
        progress.row(row(step))
    assert reports[-1]["step"] == 4
    assert "training_log.jsonl not uploaded to " + URI in caplog.text


def test_status_line():
    record = {"stage": "train eagle3 head on 40 samples", "step": 40, "total": 200,
              "loss": 2.3141, "accuracy": [0.41, 0.2], "tokens_per_second": 1234.4,
              "eta_seconds": 320, "updated": 1000.0}
    assert progress_line(record, now=1008.0) == (
        "    train eagle3 head on 40 samples: step 40/200 (20%)  loss 2.314  "
        "train acc@1/2 0.41/0.20  1,234 tokens/s  ETA 5m20s  (updated 8s ago)")
    assert progress_line({"stage": "benchmark baseline vs EAGLE", "updated": 1000.0},
                         now=1065.0) == "    benchmark baseline vs EAGLE  (updated 1m05s ago)"
    assert progress_line(None, now=0) is None and describe({"stage": "x"}) == ""


def test_bench_progress_lines_records_and_eta(caplog):
    clock, reports = Clock(), []
    progress = BenchProgress("j1", "benchmark baseline vs EAGLE", reports.append, clock)
    progress.plan("embedded", {1: 2, 4: 4}, rows=2, rounds=2)  # (2 + 4) * 2 rows * 2 = 24
    caplog.set_level(logging.INFO, logger="eaglenest.optimize")
    progress.starting("baseline", 1, 2)
    progress.starting("chain K=3", 2, 2)
    # (level, row, round, requests, seconds measuring, tok/s); 1 s between measurements
    plan = [(1, "baseline", 0, 2, 4, 50.0), (1, "chain K=3", 0, 2, 2, 100.0),
            (1, "chain K=3", 1, 2, 2, 101.0), (1, "baseline", 1, 2, 4, 51.0),
            (4, "baseline", 0, 4, 2, 150.0)]
    for level, name, r, requests, seconds, tok_s in plan:
        clock.t += 1.0
        progress.measuring(level, name, r)
        clock.t += seconds
        progress.measured(name, r, requests, tok_s)
    # ETA: the requests left at the latest level's rate (level 1: 2/4, 4/6, 6/8, 8/12 req/s;
    # level 4: its first row's 4/2)
    assert [r.getMessage() for r in caplog.records] == [
        "job j1: benchmark: starting the baseline server (1/2, embedded)",
        "job j1: benchmark: starting the chain K=3 server (2/2, embedded)",
        "job j1: benchmark: concurrency 1 (level 1/2)  baseline (embedded)  round 1/2  "
        "50.0 tok/s  requests 2/24 (8%)  ETA 44s",
        "job j1: benchmark: concurrency 1 (level 1/2)  chain K=3 (embedded)  round 1/2  "
        "100.0 tok/s  requests 4/24 (16%)  ETA 30s",
        "job j1: benchmark: concurrency 1 (level 1/2)  chain K=3 (embedded)  round 2/2  "
        "101.0 tok/s  requests 6/24 (25%)  ETA 24s",
        "job j1: benchmark: concurrency 1 (level 1/2)  baseline (embedded)  round 2/2  "
        "51.0 tok/s  requests 8/24 (33%)  ETA 24s",
        "job j1: benchmark: concurrency 4 (level 2/2)  baseline (embedded)  round 1/2  "
        "150.0 tok/s  requests 12/24 (50%)  ETA 6s"]
    # a record before each measurement (no log line) and after it, all with the stage
    assert [r["phase"] for r in reports] == ["starting"] * 2 + ["measuring", "measured"] * 5
    assert {r["stage"] for r in reports} == {"benchmark baseline vs EAGLE"}
    first, new_level = reports[2], reports[10]
    assert (first["requests"], first["requests_total"], first["eta_seconds"]) == (0, 24, None)
    assert describe(first) == ("concurrency 1 (level 1/2)  measuring baseline (embedded)  "
                               "round 1/2  requests 0/24 (0%)")
    # a new level starts at the last level's rate: 16 left at 2/3 req/s
    assert (new_level["level"], new_level["level_index"]) == (4, 2)
    assert new_level["eta_seconds"] == pytest.approx(24.0)
    assert progress_line({**new_level, "updated": 1000.0}, now=1003.0) == (
        "    benchmark baseline vs EAGLE: concurrency 4 (level 2/2)  measuring baseline "
        "(embedded)  round 1/2  requests 8/24 (33%)  ETA 24s  (updated 3s ago)")


def test_bench_progress_without_a_job_names_none(caplog):
    caplog.set_level(logging.INFO, logger="eaglenest.optimize")
    progress = BenchProgress(None, "benchmark", lambda _: None)
    progress.plan("vllm", {8: 16}, rows=3, rounds=1)
    progress.starting("chain K=1", 2, 3)
    assert caplog.records[-1].getMessage() == (
        "benchmark: starting the chain K=1 server (2/3, vllm)")


def test_heldout_accuracy_is_shown_labelled_and_dated(tmp_path, caplog):
    """Lines before the first evaluation show training accuracy only; the evaluated step's
    line shows held-out accuracy beside it; later lines keep it with the step it was
    measured at; the record carries it for `eaglenest status`."""
    store, reports, clock = LocalStore(tmp_path / "s3"), [], Clock()
    progress = make(tmp_path, store, reports, clock, total=12, every=4)
    caplog.set_level(logging.INFO, logger="eaglenest.optimize")
    for step in range(1, 13):
        clock.t += 1.0
        progress.row({**row(step), **({"heldout_accuracy": [0.61, 0.42]} if step == 8 else {})})
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == (
        "job j1: step 4/12 (33%)  loss 1.250  train acc@1/2 0.50/0.25  300 tokens/s  ETA 8s")
    assert lines[1] == ("job j1: step 8/12 (66%)  loss 0.625  train acc@1/2 0.50/0.25  "
                        "held-out acc@1/2 0.61/0.42  300 tokens/s  ETA 4s")
    assert lines[2] == ("job j1: step 12/12 (100%)  loss 0.417  train acc@1/2 0.50/0.25  "
                        "held-out acc@1/2 0.61/0.42 (step 8)  300 tokens/s  ETA 0s")
    assert (reports[-1]["heldout_accuracy"], reports[-1]["heldout_step"]) == ([0.61, 0.42], 8)


def test_a_time_budget_that_ends_first_sets_the_eta(tmp_path, caplog):
    """EAGLENEST_MAX_TRAIN_MINUTES: while the budget would end training before the step cap,
    the line shows the budget's share used and its time left; else steps as usual."""
    store, reports, clock = LocalStore(tmp_path / "s3"), [], Clock()
    progress = TrainingProgress("j1", "train", 100_000, 4, store, URI,
                                tmp_path / "work" / "training_log.jsonl", reports.append,
                                clock, budget_seconds=60.0)
    caplog.set_level(logging.INFO, logger="eaglenest.optimize")
    for step in range(1, 5):
        clock.t += 3.0
        progress.row(row(step))  # 12 s of 60: the cap is days away, the budget 48 s
    assert reports[-1]["eta_seconds"] == pytest.approx(48.0)
    assert reports[-1]["budget_used"] == pytest.approx(0.2)
    assert caplog.records[-1].getMessage().startswith("job j1: step 4 (20% of 1m00s)  loss ")
    assert caplog.records[-1].getMessage().endswith("ETA 48s")
    short = TrainingProgress("j2", "train", 8, 4, store, "s3://output/jobs/j2/log.jsonl",
                             tmp_path / "j2.jsonl", reports.append, clock, budget_seconds=60.0)
    for step in range(1, 5):
        clock.t += 3.0
        short.row(row(step))  # 4 steps left at 3 s: the steps end first
    assert "budget_seconds" not in reports[-1] and reports[-1]["eta_seconds"] == 12.0
    assert describe(reports[-1]).startswith("step 4/8 (50%)")
