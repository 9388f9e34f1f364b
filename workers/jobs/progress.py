"""An optimization job's training progress where users look: the worker log, `eaglenest
status` and the job's output prefix.

`TrainingProgress.row` takes each training step's history row (models.train's `on_step`, or
the ranks' rows under torchrun: workers/jobs/train_launch.py). Every `every` steps, and at
the last step (`finish`), it
- logs one line, `job NAME: step 40/200 (20%)  loss 2.314  accuracy 0.41/0.22/0.10
  1,234 tokens/s  ETA 5m20s` (the record also carries job=NAME: the task's log context);
- records the same figures with the stage in the job's row (JobControl.report), which
  `eaglenest status` shows for running jobs; no API shape returns them;
- uploads `training_log.jsonl` (one row per step so far, each with its `ts`) to
  `<output prefix>/training_log.jsonl`, so a watcher of the prefix sees it grow. The job's
  final upload replaces it with the complete log.
A resumed job keeps the published rows before the step it resumes at.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eaglenest.foundation.storage import ArtifactStore, StorageError, parse_uri

log = logging.getLogger("eaglenest.optimize")
LOG_NAME = "training_log.jsonl"


def format_duration(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def describe(progress: dict[str, Any]) -> str:
    """A progress record as one line (the log line's text and `eaglenest status`)."""
    if "step" not in progress:
        return ""
    step, total = progress["step"], max(int(progress["total"]), 1)
    parts = [f"step {step}/{total} ({100 * step // total}%)", f"loss {progress['loss']:.3f}"]
    if progress.get("accuracy"):
        parts.append("accuracy " + "/".join(f"{a:.2f}" for a in progress["accuracy"]))
    parts.append(f"{progress['tokens_per_second']:,.0f} tokens/s")
    parts.append(f"ETA {format_duration(progress['eta_seconds'])}")
    return "  ".join(parts)


class TrainingProgress:
    def __init__(self, job: str, stage: str, total: int, every: int, store: ArtifactStore,
                 uri: str, path: Path, report: Callable[[dict[str, Any]], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job, self.stage, self.total, self.every = job, stage, total, every
        self.store, self.uri, self.path, self.report = store, uri, path, report
        self.clock = clock
        self.rows = self._published()
        self.started = self.window_start = clock()
        self.window_tokens = 0
        self.first_step: int | None = None
        self.reported = 0

    def _published(self) -> list[dict[str, Any]]:
        try:
            data = self.store.get_bytes(parse_uri(self.uri))
        except StorageError:
            return []
        return [json.loads(line) for line in data.decode().splitlines() if line.strip()]

    def row(self, row: dict[str, Any]) -> None:
        step = int(row["step"])
        if self.first_step is None:  # resumed: drop the published rows from here on
            self.first_step = step
            self.rows = [r for r in self.rows if int(r["step"]) < step]
        self.rows.append(row)
        self.window_tokens += int(row.get("tokens", 0))
        if step % self.every == 0 or step >= self.total:
            self._publish(row)

    def finish(self) -> None:
        """After the last step: report it unless it was already."""
        if self.rows and int(self.rows[-1]["step"]) != self.reported:
            self._publish(self.rows[-1])

    def _publish(self, row: dict[str, Any]) -> None:
        now = self.clock()
        step = int(row["step"])
        done = step - (self.first_step or step) + 1
        progress = {
            "stage": self.stage, "step": step, "total": self.total, "loss": row["loss"],
            "accuracy": row.get("accuracy", []),
            "tokens_per_second": self.window_tokens / max(now - self.window_start, 1e-9),
            "eta_seconds": (self.total - step) * (now - self.started) / done,
            "updated": time.time(),
        }
        self.window_start, self.window_tokens, self.reported = now, 0, step
        log.info("job %s: %s", self.job, describe(progress))
        self.report(progress)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        try:
            self.store.put_file(parse_uri(self.uri), self.path)
        except Exception as exc:  # the store's outage costs a progress upload, not the job
            log.warning("job %s: %s not uploaded to %s: %s", self.job, LOG_NAME, self.uri, exc)
