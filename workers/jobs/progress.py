"""An optimization job's progress where users look: the worker log, `eaglenest status` and
(training) the job's output prefix.

`TrainingProgress.row` takes each training step's history row (models.training.train's `on_step`, or
the ranks' rows under torchrun: workers/jobs/train_launch.py). Every `every` steps, and at
the last step (`finish`), it
- logs one line, `job NAME: step 100/200 (50%)  loss 2.314  train acc@1/2/3 0.94/0.95/0.98
  held-out acc@1/2/3 0.61/0.42/0.30  1,234 tokens/s  ETA 5m20s` (the record also carries
  job=NAME: the task's log context). `train` is the step's greedy draft accuracy per depth
  on its training batch, which a head can learn by heart; `held-out` is the same metric on
  the EAGLENEST_HOLDOUT samples (models/training/evaluate.py), measured every EAGLENEST_EVAL_EVERY
  steps: shown from the first evaluation on, with `(step N)` after it when it was measured
  at an earlier step than the line's. Where the time budget (EAGLENEST_MAX_TRAIN_MINUTES)
  will end training before the step cap, the line starts `step 412 (40% of 30m00s)` and the
  ETA is what is left of the budget;
- records the same figures with the stage in the job's row (JobControl.report), which
  `eaglenest status` shows for running jobs; no API shape returns them;
- uploads `training_log.jsonl` (one row per step so far, each with its `ts`) to
  `<output prefix>/training_log.jsonl`, so a watcher of the prefix sees it grow. The job's
  final upload replaces it with the complete log.
A resumed job keeps the published rows before the step it resumes at.

`CaptureProgress` (workers/jobs/capture_stage.py) logs and records a line per capture shard
(EAGLENEST_CAPTURE_BACKEND=hf), `job NAME: capture: shard 3/8 (37%)  samples 192/500
12.3 samples/s  1.2 MB  ETA 40s`; `describe` shows its records too.

`BenchProgress` does the same for the benchmark stage (workers/jobs/bench_stage.py): a log
line as each server starts and as each row (baseline or "decoding K=n") finishes a round at a
level, `job NAME: benchmark: concurrency 4 (level 2/3)  chain K=3 (embedded)  round 1/2
123.4 tok/s  requests 56/96 (58%)  ETA 2m40s`, a line when a level gets a round more than
planned because a figure its choice rests on is not yet steady (workers/jobs/
bench_rows.py), `job NAME: benchmark: concurrency 1 (level 1/3)  round 3 added: tree K=5
pooled spread 8.1%  requests 96/144 (66%)` (the total and the level's rounds grow with it),
and a record of the same figures for `eaglenest status` at the start and end of each
measurement (never during one: a database write would disturb the timings).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eaglenest.foundation.store.storage import ArtifactStore, StorageError, parse_uri

log = logging.getLogger("eaglenest.optimize")
LOG_NAME = "training_log.jsonl"
HELDOUT_KEY = "heldout_accuracy"  # models/training/evaluate.py HELDOUT_KEY (no torch import here)


def format_duration(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def describe(progress: dict[str, Any]) -> str:
    """A progress record as one line (the log line's text and `eaglenest status`); "" for a
    record with its stage only."""
    if "shard" in progress:
        return _describe_capture(progress)
    if "phase" in progress:
        return _describe_bench(progress)
    if "step" not in progress:
        return ""
    step, total = progress["step"], max(int(progress["total"]), 1)
    if progress.get("budget_seconds"):  # a time budget, not the step cap, ends training
        used = min(int(100 * progress["budget_used"]), 100)
        where = f"step {step} ({used}% of {format_duration(progress['budget_seconds'])})"
    else:
        where = f"step {step}/{total} ({100 * step // total}%)"
    parts = [where, f"loss {progress['loss']:.3f}"]
    accuracy = progress.get("accuracy") or []
    if accuracy:  # on the training batch, per draft depth
        parts.append(f"train {_accuracy(accuracy)}")
    heldout = progress.get("heldout_accuracy") or []
    if heldout:  # the last held-out evaluation, per draft depth
        when = progress.get("heldout_step", step)
        parts.append(f"held-out {_accuracy(heldout)}" + (f" (step {when})" if when != step
                                                          else ""))
    parts.append(f"{progress['tokens_per_second']:,.0f} tokens/s")
    parts.append(f"ETA {format_duration(progress['eta_seconds'])}")
    return "  ".join(parts)


def _accuracy(accuracy: list[float]) -> str:
    """`acc@1/2/3 0.41/0.22/0.10`: one figure per draft depth."""
    depths = "/".join(str(d) for d in range(1, len(accuracy) + 1))
    return f"acc@{depths} " + "/".join(f"{a:.2f}" for a in accuracy)


def _describe_capture(p: dict[str, Any]) -> str:
    """The capture stage's record (workers/jobs/capture_stage.py ``CaptureProgress``)."""
    shards = max(int(p["shards"]), 1)
    return "  ".join([
        f"shard {p['shard']}/{shards} ({100 * p['shard'] // shards}%)",
        f"samples {p['samples']}/{p['samples_total']}",
        f"{p['samples_per_second']:,.1f} samples/s", f"{p['bytes'] / 1e6:,.1f} MB",
        f"ETA {format_duration(p['eta_seconds'])}"])


def _describe_bench(p: dict[str, Any]) -> str:
    if p["phase"] == "starting":
        return f"starting the {p['row']} server ({p['server']}/{p['servers']}, {p['backend']})"
    measuring = p["phase"] == "measuring"
    done, total = p["requests"], max(int(p["requests_total"]), 1)
    level = f"concurrency {p['level']} (level {p['level_index']}/{p['levels']})"
    if p["phase"] == "round added":
        return "  ".join([level, f"round {p['rounds']} added: {p['row']} pooled spread "
                                 f"{100 * p['spread']:.1f}%",
                          f"requests {done}/{total} ({100 * done // total}%)"])
    parts = [level, f"{'measuring ' if measuring else ''}{p['row']} ({p['backend']})",
             f"round {p['round']}/{p['rounds']}"]
    if not measuring:
        parts.append(f"{p['tok_s']:,.1f} tok/s")
    parts.append(f"requests {done}/{total} ({100 * done // total}%)")
    if p.get("eta_seconds") is not None:
        parts.append(f"ETA {format_duration(p['eta_seconds'])}")
    return "  ".join(parts)


class TrainingProgress:
    def __init__(self, job: str, stage: str, total: int, every: int, store: ArtifactStore,
                 uri: str, path: Path, report: Callable[[dict[str, Any]], None],
                 clock: Callable[[], float] = time.monotonic,
                 budget_seconds: float | None = None) -> None:
        self.job, self.stage, self.total, self.every = job, stage, total, every
        self.budget = budget_seconds  # EAGLENEST_MAX_TRAIN_MINUTES, from this process's start
        self.store, self.uri, self.path, self.report = store, uri, path, report
        self.clock = clock
        self.rows = self._published()
        self.started = self.window_start = clock()
        self.window_tokens = 0
        self.first_step: int | None = None
        self.reported = 0
        self.heldout: dict[str, Any] = {}  # the last evaluation: heldout_accuracy, _step

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
            for kept in self.rows:
                self._note_heldout(kept)
        self._note_heldout(row)
        self.rows.append(row)
        self.window_tokens += int(row.get("tokens", 0))
        if step % self.every == 0 or step >= self.total:
            self._publish(row)

    def _note_heldout(self, row: dict[str, Any]) -> None:
        if row.get(HELDOUT_KEY):
            self.heldout = {HELDOUT_KEY: row[HELDOUT_KEY], "heldout_step": int(row["step"])}

    def finish(self) -> None:
        """After the last step: report it unless it was already."""
        if self.rows and int(self.rows[-1]["step"]) != self.reported:
            self._publish(self.rows[-1])

    def _publish(self, row: dict[str, Any]) -> None:
        now = self.clock()
        step = int(row["step"])
        done = step - (self.first_step or step) + 1
        elapsed = now - self.started
        eta = (self.total - step) * elapsed / done
        progress = {
            "stage": self.stage, "step": step, "total": self.total, "loss": row["loss"],
            "accuracy": row.get("accuracy", []), **self.heldout,
            "tokens_per_second": self.window_tokens / max(now - self.window_start, 1e-9),
            "eta_seconds": eta, "updated": time.time(),
        }
        if self.budget is not None and self.budget - elapsed < eta:  # the budget ends first
            progress.update(eta_seconds=max(self.budget - elapsed, 0.0),
                            budget_seconds=self.budget, budget_used=elapsed / self.budget)
        self.window_start, self.window_tokens, self.reported = now, 0, step
        log.info("job %s: %s", self.job, describe(progress))
        self.report(progress)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        try:
            self.store.put_file(parse_uri(self.uri), self.path)
        except Exception as exc:  # the store's outage costs a progress upload, not the job
            log.warning("job %s: %s not uploaded to %s: %s", self.job, LOG_NAME, self.uri, exc)


class BenchProgress:
    """The benchmark stage's progress: `plan` once, then `starting` per server, then
    `measuring` and `measured` around each measurement (a row, one round, at one level).

    Requests done/total count every row's requests at every level and round planned: the
    rounds `plan` names at each level, and each round `round_added` adds to a level (so the
    total grows when one is). The ETA is the requests left at the request rate measured so
    far at the latest level (none before the first measurement ends); higher levels usually
    serve more requests a second, so it errs long. ``job`` None: lines without `job NAME: `
    (`eaglenest bench`)."""

    def __init__(self, job: str | None, stage: str, report: Callable[[dict[str, Any]], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job, self.stage, self.report, self.clock = job, stage, report, clock
        self.backend, self.rounds, self.rows = "", 1, 0
        self.levels: tuple[int, ...] = ()
        self.per_round: dict[int, int] = {}
        self.level_rounds: dict[int, int] = {}  # rounds planned at each level so far
        self.done = self.total = 0
        self.level: int | None = None
        self.level_requests, self.level_seconds, self.started = 0, 0.0, 0.0
        self.rate: float | None = None  # requests/s at the latest level

    def plan(self, backend: str, per_round: dict[int, int], rows: int, rounds: int) -> None:
        """``per_round``: each level's (concurrency's) requests in a round of one row;
        ``rounds``: the rounds each level gets at least."""
        self.backend, self.levels, self.rounds = backend, tuple(per_round), rounds
        self.per_round, self.rows = dict(per_round), rows
        self.level_rounds = {c: rounds for c in per_round}
        self.total = sum(per_round.values()) * rows * rounds

    def round_added(self, level: int, row: str, spread: float) -> None:
        """Concurrency ``level`` gets a round more (every row once more) because ``row``,
        one of the level's watched rows (bench_rows.watched), has a pooled spread of
        ``spread`` over its rounds so far."""
        self.level_rounds[level] = self.level_rounds.get(level, self.rounds) + 1
        self.total += self.per_round.get(level, 0) * self.rows
        record = {"phase": "round added", "level": level,
                  "level_index": self.levels.index(level) + 1 if level in self.levels else 0,
                  "levels": len(self.levels), "row": row, "spread": spread,
                  "backend": self.backend, "rounds": self.level_rounds[level],
                  "requests": self.done, "requests_total": self.total}
        self._publish(record, log_it=True)

    def starting(self, row: str, index: int, servers: int) -> None:
        self._publish({"phase": "starting", "row": row, "server": index, "servers": servers,
                       "backend": self.backend}, log_it=True)

    def measuring(self, level: int, row: str, round_index: int) -> None:
        """Before measuring ``row`` at concurrency ``level`` (round_index counts from 0)."""
        if level != self.level:
            self.level, self.level_requests, self.level_seconds = level, 0, 0.0
        self.started = self.clock()
        self._publish(self._record("measuring", row, round_index), log_it=False)

    def measured(self, row: str, round_index: int, requests: int, tok_s: float) -> None:
        self.level_seconds += self.clock() - self.started
        self.level_requests += requests
        self.done += requests
        self.rate = self.level_requests / max(self.level_seconds, 1e-9)
        self._publish({**self._record("measured", row, round_index), "tok_s": tok_s},
                      log_it=True)

    def _record(self, phase: str, row: str, round_index: int) -> dict[str, Any]:
        eta = (self.total - self.done) / self.rate if self.rate else None
        rounds = self.rounds if self.level is None else self.level_rounds.get(self.level,
                                                                              self.rounds)
        return {"phase": phase, "level": self.level,
                "level_index": self.levels.index(self.level) + 1 if self.level in self.levels
                else 0, "levels": len(self.levels), "row": row, "backend": self.backend,
                "round": round_index + 1, "rounds": rounds, "requests": self.done,
                "requests_total": self.total, "eta_seconds": eta}

    def _publish(self, record: dict[str, Any], log_it: bool) -> None:
        progress = {"stage": self.stage, **record, "updated": time.time()}
        if log_it:
            prefix = f"job {self.job}: " if self.job else ""
            log.info("%sbenchmark: %s", prefix, describe(progress))
        self.report(progress)
