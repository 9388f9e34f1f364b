"""An optimization job's figures: the metric store's per-minute series and the per-step
training curve in the job's row, both from the progress records the job reports
(workers/jobs/control.py `JobControl.report`: the stage at each stage change, each logged
training step from workers/jobs/progress.py `TrainingProgress`).

Namespace "EagleNest/OptimizationJobs", dimension (OptimizationJobName), the job's account:
- at each logged training step: TrainingLoss (None), TrainingStep (Count),
  TrainAccuracy1..3 (Percent, 0-100: the step's greedy draft accuracy at depths 1..3 on its
  training batch), HeldOutAccuracy1..3 (Percent, once per held-out evaluation, at the
  report that first carries it), StageIndex (None);
- at each stage change: StageIndex, the 0-based index of the stage being run among the
  stages this run of the job has entered, in the order first entered (a stage entered again,
  e.g. training's own records after the torchrun stage line, keeps its index; a resumed job
  counts from its first stage again).

`progress["curve"]`, written with every progress record (the row keeps only the last record,
db/optimization_jobs_repo.py `record_progress`): a list of {"step", "loss", "train_acc":
[a1, a2, a3], "held_out_acc": [..] or None, "time"} (accuracies as fractions 0-1, as in the
progress record; `held_out_acc` only at the first point that carries a new held-out
evaluation, else None; `time` epoch seconds), one point per logged training step,
ascending by step. At most `CURVE_POINTS`: a point that would make it longer first drops every other
point (the oldest kept). A resumed job's curve goes on from the row's: points at or after the
step it resumes at are replaced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eaglenest.db.metrics_repo import Datum
from eaglenest.workers.infra.metrics import datum

NAMESPACE = "EagleNest/OptimizationJobs"
DIMENSION = "OptimizationJobName"
CURVE_POINTS = 200
#: accuracy depths written as metrics (TrainAccuracy1..3, HeldOutAccuracy1..3)
DEPTHS = 3


def is_training(progress: dict[str, Any]) -> bool:
    """A training step's record (not the capture's shards, not the benchmark's phases)."""
    return "step" in progress and "loss" in progress and "phase" not in progress


class JobFigures:
    """One run of one job: its stages so far, its curve, the data it hands `sink`."""

    def __init__(self, job: str, sink: Callable[[list[Datum]], None]) -> None:
        self.dims = {DIMENSION: job}
        self.sink = sink
        self.curve: list[dict[str, Any]] | None = None  # None until seeded from the row
        self.stage: str | None = None
        self.stage_index = -1
        self.stages: dict[str, int] = {}  # each stage's index, in the order first entered
        self.heldout_step: int | None = None  # the evaluation last written
        self.added = 0  # data handed to the sink

    def seed(self, curve: Any, name: str | None = None) -> None:
        """Go on from the curve the job's row holds (a resumed job's), if it holds one;
        `name`: the job's name as it was created (an ARN's is lower-cased)."""
        if name:
            self.dims = {DIMENSION: name}
        self.curve = [dict(p) for p in curve if isinstance(p, dict) and "step" in p] \
            if isinstance(curve, list) else []
        del self.curve[:-CURVE_POINTS]

    def observe(self, progress: dict[str, Any]) -> dict[str, Any]:
        """The record to store (with the curve), after handing its figures to the sink."""
        if self.curve is None:
            self.curve = []
        at = float(progress.get("updated") or 0.0) or None
        data: list[Datum] = []
        stage = progress.get("stage")
        if stage is not None and stage != self.stage:
            self.stage = stage
            self.stage_index = self.stages.setdefault(stage, len(self.stages))
            data.append(self._datum("StageIndex", self.stage_index, "None", at))
        if is_training(progress):
            heldout = progress.get("heldout_accuracy") or []
            when = progress.get("heldout_step", progress["step"])
            evaluated = heldout if heldout and when != self.heldout_step else []
            self.heldout_step = when if evaluated else self.heldout_step
            data += self._step(progress, evaluated, at)
            self._add_point(progress, evaluated)
        if data:
            self.sink(data)
            self.added += len(data)
        # the stage labels this run entered, in order (the console draws them)
        return {**progress, "curve": list(self.curve), "stages": list(self.stages)}

    def _datum(self, name: str, value: float, unit: str, at: float | None) -> Datum:
        return datum(NAMESPACE, name, self.dims, value, unit, at)

    def _step(self, progress: dict[str, Any], evaluated: list[float],
              at: float | None) -> list[Datum]:
        """A logged step's data; `evaluated`: a held-out evaluation not written yet."""
        data = [self._datum("TrainingLoss", float(progress["loss"]), "None", at),
                self._datum("TrainingStep", int(progress["step"]), "Count", at)]
        if self.stage_index >= 0:
            data.append(self._datum("StageIndex", self.stage_index, "None", at))
        for depth, acc in enumerate((progress.get("accuracy") or [])[:DEPTHS], start=1):
            data.append(self._datum(f"TrainAccuracy{depth}", 100.0 * acc, "Percent", at))
        for depth, acc in enumerate(evaluated[:DEPTHS], start=1):
            data.append(self._datum(f"HeldOutAccuracy{depth}", 100.0 * acc, "Percent", at))
        return data

    def _add_point(self, progress: dict[str, Any], evaluated: list[float]) -> None:
        assert self.curve is not None
        step = int(progress["step"])
        while self.curve and int(self.curve[-1]["step"]) >= step:  # resumed at `step`
            self.curve.pop()
        if len(self.curve) >= CURVE_POINTS:
            self.curve = self.curve[::2]
        self.curve.append({
            "step": step, "loss": float(progress["loss"]),
            "train_acc": list(progress.get("accuracy") or [])[:DEPTHS],
            "held_out_acc": list(evaluated)[:DEPTHS] if evaluated else None,
            "time": float(progress.get("updated") or 0.0)})
