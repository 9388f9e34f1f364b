"""A job's figures (workers/jobs/job_metrics.py) through JobControl.report on a real SQLite
database: the "EagleNest/OptimizationJobs" series in the metric store (read back with
db/metrics_repo.py statistics, under the job's account and name as created) and the
training curve in the job's row, bounded and ascending; a resumed job's curve goes on.
One test trains the tiny target for real, its steps reported by TrainingProgress."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from eaglenest.db import metrics_repo
from eaglenest.db import optimization_jobs_repo as jobs
from eaglenest.db.migrate import upgrade_head
from eaglenest.db.session import Database
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.queue import TaskQueue
from eaglenest.foundation.settings import Settings
from eaglenest.foundation.store.storage import LocalStore
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.jobs.control import JobControl
from eaglenest.workers.jobs.job_metrics import CURVE_POINTS, NAMESPACE, JobFigures
from eaglenest.workers.jobs.progress import TrainingProgress

ACCOUNT = Account("us-east-1", "123456789012")
OTHER = Account("us-east-1", "222222222222")
NAME = "Tiny-Job"  # the ARN lower-cases it; the dimension keeps it as created
ARN = ACCOUNT.arn("optimization-job", NAME)
SPEC = {
    "OptimizationJobName": NAME, "RoleArn": "arn:aws:iam::123456789012:role/r",
    "ModelSource": {"S3": {"S3Uri": "s3://b/m/"}}, "DeploymentInstanceType": "ml.g5.2xlarge",
    "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
    "OutputConfig": {"S3OutputLocation": "s3://b/o/"},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
}
DIMS = (("OptimizationJobName", NAME),)


@pytest.fixture
def ctx(tmp_path: Path):  # type: ignore[no-untyped-def]
    settings = Settings(data_dir=tmp_path)
    upgrade_head(settings.resolved_database_url())
    c = WorkerContext(settings=settings, db=Database(settings.resolved_database_url()),
                      queue=TaskQueue("redis://127.0.0.1:9/0"), owner="w-1")
    with c.db.session() as s:
        jobs.create(s, ACCOUNT, SPEC)
        assert jobs.claim(s, ARN, "w-1") is not None
    yield c
    c.metrics.close()
    c.db.dispose()


def stats(ctx: WorkerContext, name: str, account: Account = ACCOUNT) -> list[metrics_repo.Stat]:
    now = time.time()
    with ctx.db.session() as s:
        return metrics_repo.statistics(s, account.account_id, NAMESPACE, name, DIMS,
                                       now - 3600, now + 60, 3600)


def stored_progress(ctx: WorkerContext) -> dict:
    with ctx.db.session() as s:
        return dict(jobs.get(s, NAME, account=ACCOUNT).progress or {})


def row(step: int) -> dict:
    """A history row as models/training/train.py writes it; held-out accuracy at step 4."""
    out = {"step": step, "loss": 8.0 / step, "lr": 1e-3, "accuracy": [0.5, 0.25, 0.125, 0.1],
           "tokens": 100}
    if step == 4:
        out["heldout_accuracy"] = [0.61, 0.42, 0.3, 0.2]
    return out


def test_reports_write_the_series_and_the_curve(ctx, tmp_path):
    control = JobControl(ctx, ARN, None, time.time())
    control.report({"stage": "download model", "updated": time.time()})
    label = "train eagle3 head on 8 samples"
    control.report({"stage": label, "updated": time.time()})
    progress = TrainingProgress(NAME, label, 8, 2, LocalStore(tmp_path / "s3"),
                                "s3://output/jobs/Tiny-Job/training_log.jsonl",
                                tmp_path / "out" / "training_log.jsonl", control.report)
    for step in range(1, 9):
        progress.row(row(step))
    progress.finish()
    control.report({"stage": "export head", "updated": time.time()})
    ctx.metrics.flush()

    [loss] = stats(ctx, "TrainingLoss")
    assert (loss.sample_count, loss.sum, loss.unit) == (4, 8 / 2 + 8 / 4 + 8 / 6 + 8 / 8, "None")
    [steps] = stats(ctx, "TrainingStep")
    assert (steps.minimum, steps.maximum, steps.unit) == (2, 8, "Count")
    [stage] = stats(ctx, "StageIndex")  # 0, 1, 1 x 4 (with each step), 2
    assert (stage.sample_count, stage.minimum, stage.maximum, stage.sum) == (7, 0, 2, 7)
    [train1] = stats(ctx, "TrainAccuracy1")
    assert (train1.sample_count, train1.maximum, train1.unit) == (4, 50.0, "Percent")
    assert stats(ctx, "TrainAccuracy3")[0].maximum == 12.5
    assert stats(ctx, "TrainAccuracy4") == []  # depths 1..3 only
    [held] = stats(ctx, "HeldOutAccuracy2")  # one evaluation: written once, not per report
    assert (held.sample_count, held.sum, held.unit) == (1, 42.0, "Percent")
    assert stats(ctx, "TrainingLoss", OTHER) == []  # another account sees none of it

    record = stored_progress(ctx)
    assert record["stage"] == "export head"  # the curve is kept beside the last record
    curve = record["curve"]
    assert [p["step"] for p in curve] == [2, 4, 6, 8]
    assert curve[0]["loss"] == 4.0 and curve[0]["train_acc"] == [0.5, 0.25, 0.125]
    assert [p["held_out_acc"] for p in curve] == [None, [0.61, 0.42, 0.3], None, None]
    assert all(isinstance(p["time"], float) and p["time"] > 0 for p in curve)


def test_the_curve_is_bounded_and_a_resumed_job_goes_on(ctx):
    control = JobControl(ctx, ARN, None, time.time())
    for step in range(1, 451):
        control.figures.observe({"stage": "train", "step": step, "loss": 1.0, "accuracy": [],
                                 "updated": 1.0})
    curve = control.figures.curve
    assert curve is not None and len(curve) <= CURVE_POINTS
    steps = [p["step"] for p in curve]
    assert steps == sorted(steps) and steps[0] == 1 and steps[-1] == 450
    control.report({"stage": "train", "step": 451, "loss": 0.5, "accuracy": [0.9],
                    "updated": time.time()})
    kept = [p["step"] for p in stored_progress(ctx)["curve"]]
    assert kept[-1] == 451 and len(kept) <= CURVE_POINTS

    resumed = JobControl(ctx, ARN, None, time.time())  # another worker, from step 300
    resumed.report({"stage": "train", "step": 300, "loss": 0.7, "accuracy": [],
                    "updated": time.time()})
    again = [p["step"] for p in stored_progress(ctx)["curve"]]
    assert again[-1] == 300 and again[:-1] == [s for s in kept if s < 300]


def test_stage_changes_count_from_zero_and_repeat_nothing():
    sent: list = []
    figures = JobFigures("j", sent.extend)
    for stage in ("download model", "download model", "train", "train in 2 processes",
                  "train", "benchmark", "benchmark"):
        record = figures.observe({"stage": stage, "phase": "measuring", "updated": 10.0})
    # the record lists the labels entered, in order (api/console/stages.py draws them)
    assert record["stages"] == ["download model", "train", "train in 2 processes",
                                "benchmark"]
    assert [(d.name, d.value, d.at) for d in sent] == [
        ("StageIndex", 0.0, 10.0), ("StageIndex", 1.0, 10.0), ("StageIndex", 2.0, 10.0),
        ("StageIndex", 1.0, 10.0),  # training's records name the stage it entered first
        ("StageIndex", 3.0, 10.0)]
    assert figures.curve == []  # a benchmark record is no training step


def test_a_real_training_run_reports_its_steps(ctx, tmp_path, tiny_llama_dir):
    """models/training/train.py's on_step -> TrainingProgress -> JobControl.report."""
    from eaglenest.models.data import builtin_path, encode_examples, load_examples
    from eaglenest.models.target import load_target
    from eaglenest.models.training.config import TrainConfig
    from eaglenest.models.training.train import TrainData, train

    control = JobControl(ctx, ARN, None, time.time())
    label = "train eagle3 head on 8 samples"
    control.report({"stage": label, "updated": time.time()})
    progress = TrainingProgress(NAME, label, 4, 2, LocalStore(tmp_path / "s3"),
                                "s3://output/jobs/Tiny-Job/training_log.jsonl",
                                tmp_path / "out" / "training_log.jsonl", control.report)
    target = load_target(tiny_llama_dir)
    samples = encode_examples(load_examples(builtin_path("gsm8k_training.jsonl"))[:8],
                              target.tokenizer, max_length=128)
    result = train(TrainConfig(head="eagle3", out_dir=str(tmp_path / "train"), max_steps=4,
                               draft_vocab_size=64, progress=False, on_step=progress.row),
                   TrainData(target, samples, source="test"))
    progress.finish()
    with control:  # its end writes what the process has pending
        pass
    losses = {int(r["step"]): float(r["loss"]) for r in result.history}
    [loss] = stats(ctx, "TrainingLoss")
    assert loss.sample_count == 2 and loss.sum == pytest.approx(losses[2] + losses[4])
    assert stats(ctx, "TrainingStep")[0].maximum == 4
    assert stats(ctx, "StageIndex")[0].maximum == 0
    assert [p["step"] for p in stored_progress(ctx)["curve"]] == [2, 4]
