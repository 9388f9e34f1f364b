"""The optimization job's capture stage (EAGLENEST_CAPTURE_BACKEND; docs/capture-shards.md).

With ``hf`` the job runs the transformers target once per training sample and writes the
hidden states as capture shards (models/capture_shards.py ``write_shards``) to
``<work>/capture/``, then does the same for the held-out samples (the held-out split, in
the same folder); training then reads both (models/shard_source.py ``shard_train_data``)
instead of capturing in its own process, and the held-out accuracy is measured from the
held-out shards. ``auto`` (the default) keeps
the in-process capture. ``vllm`` is refused when the options are read
(workers/jobs/options.py ``VLLM_CAPTURE_REFUSAL``).

Contract:
- progress: one shard at a time (``write_shards(..., max_new_shards=1)``), a stop check
  between shards, and after each shard a progress record and log line (``CaptureProgress``):
  `job NAME: capture: shard 3/8 (37%)  samples 192/500  12.3 samples/s  1.2 MB  ETA 40s`;
- resume: the work dir survives a worker's death and a shutdown hand-back (optimize.py
  deletes it only when the job ends), so a re-run finds the complete shards and skips them
  (no target forward for them); a folder of another plan (other data, options or target),
  in either split, is cleared and captured again (both splits);
- held-out: after the training shards, one call writes the held-out shards (a few samples:
  no stop check or progress record between them; one log line);
- the folder's end (``discard``): deleted when the job ends, whatever the outcome, except
  a shutdown hand-back (the job resumes) or EAGLENEST_KEEP_CAPTURE=1: then a completed
  job publishes it with its outputs as ``capture/`` (``keep``) and a failed one leaves it
  in the work dir.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglenest.workers.jobs.progress import describe

log = logging.getLogger("eaglenest.optimize")
CAPTURE_DIR = "capture"
STAGE = "capture hidden states"


@dataclass
class CaptureInfo:
    """What provenance.json records of a capture."""

    backend: str  # "hf" or "in-process"
    folder: Path | None = None
    bytes: int | None = None  # the shards' bytes (hf); the in-process cache's peak use
    shards: int = 0
    reused: int = 0  # shards found complete (a resumed job)
    samples_per_second: float | None = None
    target: dict[str, str] | None = None  # the manifest's target identity
    manifest_sha256: str | None = None
    heldout_shards: int = 0  # of the held-out split (0: none captured)

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.backend, "cache_bytes": self.bytes}
        if self.backend == "hf":
            out.update(shards=self.shards, reused_shards=self.reused,
                       samples_per_second=self.samples_per_second, target=self.target,
                       manifest_sha256=self.manifest_sha256,
                       heldout_shards=self.heldout_shards)
        return out


class CaptureProgress:
    """After each shard: a log line and a record for `eaglenest status` (JobControl.report)."""

    def __init__(self, job: str, shards: int, samples: int,
                 report: Callable[[dict[str, Any]], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job, self.shards, self.samples, self.report = job, shards, samples, report
        self.clock, self.started = clock, clock()
        self.done_shards = self.done_samples = self.new_samples = self.bytes = 0

    def reused(self, shards: int, samples: int, size: int) -> None:
        self.done_shards, self.done_samples, self.bytes = shards, samples, size
        if shards:
            log.info("job %s: capture: reusing %d finished shard(s) of %d", self.job,
                     shards, self.shards)

    def shard(self, samples: int, size: int) -> float:
        """One more shard of ``samples`` samples and ``size`` bytes; the samples/s so far."""
        self.done_shards += 1
        self.done_samples += samples
        self.new_samples += samples
        self.bytes += size
        rate = self.new_samples / max(self.clock() - self.started, 1e-9)
        record = {"stage": STAGE, "shard": self.done_shards, "shards": self.shards,
                  "samples": self.done_samples, "samples_total": self.samples,
                  "samples_per_second": rate, "bytes": self.bytes,
                  "eta_seconds": (self.samples - self.done_samples) / rate,
                  "updated": time.time()}
        log.info("job %s: capture: %s", self.job, describe(record))
        self.report(record)
        return rate


def autocast(device: Any) -> contextlib.AbstractContextManager:
    """As models/train.py runs the in-process capture: bf16 autocast on CUDA, none else."""
    import torch

    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _plan(folder: Path, target: Any, samples: list[Any], heldout: list[Any],
          per_shard: int, cast: Any, job: str) -> None:
    """Plan both splits (or check the plans found) and write target/, no shard yet; a
    folder of another plan, in either split, is cleared and planned afresh."""
    from eaglenest.models.capture_shards import HELDOUT, ShardMismatchError, write_shards

    def plan_all() -> None:
        write_shards(target, samples, folder, per_shard, autocast=cast, max_new_shards=0)
        if heldout:
            write_shards(target, heldout, folder, per_shard, autocast=cast, max_new_shards=0,
                         split=HELDOUT)

    try:
        plan_all()
    except ShardMismatchError as exc:  # another plan in this work dir: not reusable
        log.warning("job %s: capture: %s; capturing again", job, exc)
        shutil.rmtree(folder, ignore_errors=True)
        plan_all()


def capture(folder: Path, target: Any, samples: list[Any], per_shard: int, job: str,
            report: Callable[[dict[str, Any]], None], check: Callable[[], None],
            heldout: list[Any] | None = None) -> CaptureInfo:
    """Write (or finish) the shards of ``samples`` in ``folder``, then those of ``heldout``
    (the held-out split; none: not captured); ``check`` raises to stop between shards
    (JobControl.check)."""
    from eaglenest.models.capture_shards import MANIFEST, read_manifest, write_shards

    cast = autocast(next(target.model.parameters()).device)
    _plan(folder, target, samples, heldout or [], per_shard, cast, job)
    shards = read_manifest(folder)["shards"]
    progress = CaptureProgress(job, len(shards), len(samples), report)
    done = [s for s in shards if s["complete"]]
    progress.reused(len(done), sum(len(s["samples"]) for s in done),
                    sum(int(s.get("bytes", 0)) for s in done))
    rate = None
    while True:
        check()
        step = write_shards(target, samples, folder, per_shard, autocast=cast,
                            max_new_shards=1)
        if not step.written:
            break
        shard = shards[step.written[0]]
        rate = progress.shard(len(shard["samples"]), step.bytes)
    held = _capture_heldout(folder, target, heldout or [], per_shard, cast, job, check)
    manifest = read_manifest(folder)
    return CaptureInfo(
        "hf", folder, sum(int(s["bytes"]) for s in manifest["shards"] + held), len(shards),
        len(done), rate, manifest["target"],
        hashlib.sha256((folder / MANIFEST).read_bytes()).hexdigest(), len(held))


def _capture_heldout(folder: Path, target: Any, heldout: list[Any], per_shard: int,
                     cast: Any, job: str, check: Callable[[], None]) -> list[dict[str, Any]]:
    """Write the held-out split's shards (all in one call); its manifest's shards."""
    from eaglenest.models.capture_shards import HELDOUT, read_manifest, write_shards

    if not heldout:
        return []
    check()
    step = write_shards(target, heldout, folder, per_shard, autocast=cast, split=HELDOUT)
    log.info("job %s: capture: held-out: %d sample(s), %d shard(s) written, %d reused",
             job, len(heldout), len(step.written), len(step.skipped))
    return list(read_manifest(folder, HELDOUT)["shards"])


def keep(info: CaptureInfo | None, out: Path) -> None:
    """EAGLENEST_KEEP_CAPTURE=1 on success: the shards move into the outputs (``capture/``)."""
    if info is not None and info.folder is not None and info.folder.is_dir():
        shutil.move(str(info.folder), str(out / CAPTURE_DIR))
        info.folder = out / CAPTURE_DIR


def discard(folder: Path, keep_it: bool, error: BaseException | None) -> None:
    """At the job's end: delete the capture folder, unless EAGLENEST_KEEP_CAPTURE=1 or the
    job is handed back at shutdown (JobStopped "shutdown": it resumes from the shards)."""
    if keep_it or getattr(error, "reason", None) == "shutdown":
        return
    shutil.rmtree(folder, ignore_errors=True)
