"""An optimization job's training stage in several data-parallel processes (torchrun + DDP).

With ``EAGLENEST_TRAIN_PROCESSES`` = N > 1 (the job's ``OptimizationEnvironment``, else the
worker's setting of the same name) the pipeline does not call ``train()`` itself: it writes
the run to ``<work>/ddp/`` (``run.json``: the TrainConfig fields, target folder, device,
the dtype the target loads in: the job's, float32 on the CPU;
``samples.json``: the encoded samples; ``heldout.json``: the held-out samples, when the job
has any; ``capture``: the capture shards' folder, or none) and
starts (as ``python -m torch.distributed.run``)

    torchrun --standalone --nproc-per-node N -m eaglenest.workers.jobs.train_launch RUN

as an owned child (foundation/host/children.py: its own process group, killed when the worker
dies; each rank also dies with torchrun). Each rank loads the target on its device
(``cuda:LOCAL_RANK``, or the CPU with gloo), or with a capture folder
(EAGLENEST_CAPTURE_BACKEND=hf) reads the shards (models/training/shard_source.py
``shard_train_data``: every rank reads the samples' tokens, but opens only the shard
files of its own share: models/training/batches.py ``RankStream``), and runs ``train()``
(models/training/distributed.py does the rest). The job keeps
control from the parent, by files, because the ranks cannot reach the job's database
session or store:

- stop: when the job's ``should_stop`` turns true (StopOptimizationJob, MaxRuntime, worker
  shutdown) the parent creates ``<work>/ddp/stop``; every rank polls it before each step
  (the ranks agree on stopping), rank 0 saves a resumable checkpoint and all exit;
- checkpoints: rank 0 writes them as usual under ``<work>/train/checkpoints``; the parent
  sees the ``latest`` pointer move and mirrors that folder to the store (CheckpointSync);
- progress: rank 0 appends each step's history row to ``progress.jsonl``; the parent reads
  the new lines as they come and hands each row to ``on_row`` (the job's progress);
- result: rank 0 writes ``result.json`` (steps, loss, accuracy, history); a rank that fails
  makes torchrun exit non-zero and the job fails with the tail of the ranks' log;
- one run at a time: torchrun's record is ``launcher.json``; a launch (a resumed job) first
  stops whatever that record's torchrun and ranks still run and waits until they are gone,
  and refuses to start when they run on another host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eaglenest.foundation.environment import child_environment
from eaglenest.foundation.failure_reason import first_exception
from eaglenest.foundation.host import children, forking
from eaglenest.foundation.host.threads import (
    ComputeLedger,
    apply_torch,
    plan_threads,
    sharing_from_env,
)

POLL_SECONDS = 0.5
LOG_TAIL = 2000
LAUNCHER = "launcher.json"
PROGRESS_FILE = "progress.jsonl"
HELDOUT_FILE = "heldout.json"  # the held-out samples, when the job has any
#: the folder holding the eaglenest package: the ranks' `-m` finds it from there
PACKAGE_ROOT = Path(__file__).parents[3]


class LaunchError(RuntimeError):
    """The training processes failed; the message ends with their log's tail."""


def write_run(run_dir: Path, config: Any, target_dir: Path, device: str, source: str,
              samples: list[Any], capture: Path | None = None,
              heldout: list[Any] | None = None, dtype: str = "float32",
              aux_layer_ids: list[int] | None = None) -> Path:
    """Write what every rank needs to ``run_dir``; the path of ``run.json``. ``heldout``:
    the held-out samples (every rank measures their accuracy every ``eval_every`` steps: the
    ranks' heads are equal, so are their figures and their plateau decisions; with a
    ``capture`` folder their captures come from its held-out split). ``dtype`` and
    ``aux_layer_ids``: the dtype each rank loads the target in (workers/jobs/job_target.py
    ``job_dtype``) and the layers it captures (None: the target's default ones)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    from eaglenest.models.training.config import config_record

    fields = config_record(config)
    for name, group in (("samples.json", samples), (HELDOUT_FILE, heldout or [])):
        (run_dir / name).write_text(json.dumps(
            [{"input_ids": s.input_ids, "loss_mask": s.loss_mask} for s in group]))
    run = {"config": fields, "target": str(target_dir), "device": device, "source": source,
           "capture": str(capture) if capture else None, "dtype": dtype,
           "aux_layer_ids": aux_layer_ids}
    (run_dir / "run.json").write_text(json.dumps(run))
    for name in ("stop", "result.json", PROGRESS_FILE):
        (run_dir / name).unlink(missing_ok=True)
    return run_dir / "run.json"


class RowReader:
    """The complete lines appended to a JSONL file since the last read (a partial last line
    waits for its newline)."""

    def __init__(self, path: Path, on_row: Callable[[dict[str, Any]], None] | None) -> None:
        self.path, self.on_row, self.offset = path, on_row, 0

    def read(self) -> None:
        if self.on_row is None or not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            if line.strip():
                self.on_row(json.loads(line))


def launch(run_file: Path, nproc: int, should_stop: Callable[[], bool],
           on_checkpoint: Callable[[Path], None] | None, children_dir: Path | None = None,
           resource: str = "",
           on_row: Callable[[dict[str, Any]], None] | None = None,
           env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the ranks to the end; the result rank 0 wrote. Raises LaunchError on failure.
    `children_dir`/`resource`: where torchrun is recorded for reaping, and for what; `on_row`
    gets each training history row as rank 0 writes it; `env` is added to the ranks'
    environment (their thread share)."""
    run_dir = run_file.parent
    rows = RowReader(run_dir / PROGRESS_FILE, on_row)
    ckpts = Path(json.loads(run_file.read_text())["config"]["out_dir"]) / "checkpoints"
    from eaglenest.models.training.distributed import torchrun_argv

    stop_predecessor(run_dir)
    cmd = [*torchrun_argv(nproc), "-m", "eaglenest.workers.jobs.train_launch", str(run_file)]
    with open(run_dir / "ranks.log", "wb") as log:
        # a confined environment (foundation/environment.py): nothing of the worker's
        proc, record = children.spawn(cmd, role="torchrun", resource=resource,
                                      children_dir=children_dir,
                                      env=child_environment(None, **(env or {})),
                                      stdout=log, stderr=subprocess.STDOUT, cwd=PACKAGE_ROOT)
        (run_dir / LAUNCHER).write_text(json.dumps(record.to_dict()))
        seen = _pointer(ckpts)
        try:
            while proc.poll() is None:
                time.sleep(POLL_SECONDS)
                if should_stop():
                    (run_dir / "stop").touch()
                seen = _mirror(ckpts, seen, on_checkpoint)
                rows.read()
        except BaseException:
            children.stop(record, timeout=0, proc=proc)
            raise
        finally:
            children.stop(record, timeout=5, proc=proc)  # ranks torchrun left, if any
            children.forget(children_dir, record)
            (run_dir / LAUNCHER).unlink(missing_ok=True)
    _mirror(ckpts, seen, on_checkpoint)
    rows.read()
    result = run_dir / "result.json"
    if proc.returncode != 0 or not result.is_file():
        raise LaunchError(f"{nproc} training processes exited with status "
                          f"{proc.returncode}: {first_error(run_dir / 'ranks.log')}")
    return dict(json.loads(result.read_text()))


def stop_predecessor(run_dir: Path) -> None:
    """Stop the torchrun (and ranks) an earlier launch in `run_dir` left, and wait for them;
    LaunchError when they run on another host (they cannot be stopped from here)."""
    path = run_dir / LAUNCHER
    try:
        record = children.ChildRecord.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return
    except (OSError, ValueError, TypeError):
        path.unlink(missing_ok=True)
        return
    if record.host != children.HOST:
        raise LaunchError(f"the job's previous training processes (torchrun pid {record.pid}) "
                          f"ran on host {record.host}; they may still run, so this host "
                          "does not start a second set beside them")
    if record.boot == children.BOOT and record.running():
        children.stop(record, timeout=10)
        if record.running():
            raise LaunchError(f"the job's previous training processes "
                              f"{record.running()} could not be stopped")
    path.unlink(missing_ok=True)


def first_error(log: Path) -> str:
    """The first exception a rank printed (torchrun's own summary after it says nothing a
    user can act on: foundation/failure_reason.py first_exception), else the log's tail."""
    text = log.read_bytes().decode(errors="replace")
    found = first_exception(text)
    return found[:LOG_TAIL] if found else text[-LOG_TAIL:]


def _pointer(ckpts: Path) -> str | None:
    try:
        return (ckpts / "latest").read_text().strip() or None
    except FileNotFoundError:
        return None


def _mirror(ckpts: Path, seen: str | None,
            on_checkpoint: Callable[[Path], None] | None) -> str | None:
    """Hand a newly written checkpoint (the pointer moved) to ``on_checkpoint``."""
    now = _pointer(ckpts)
    if now is not None and now != seen and on_checkpoint is not None:
        on_checkpoint(ckpts / now)
    return now


def rank_main(run_file: Path) -> int:
    """One rank (run by torchrun): load the target, train, rank 0 writes result.json."""
    from eaglenest.models.data.template import Sample
    from eaglenest.models.training import distributed
    from eaglenest.models.training.config import TrainConfig
    from eaglenest.models.training.train import train

    forking.die_with_parent()  # torchrun killed (its worker died): the ranks go too
    run_dir = run_file.parent
    run = json.loads(run_file.read_text())
    stop_file = run_dir / "stop"
    progress = run_dir / PROGRESS_FILE

    def append_row(row: dict[str, Any]) -> None:  # rank 0 only (train() calls it there)
        with open(progress, "a") as fh:
            fh.write(json.dumps(row) + "\n")

    config = TrainConfig(**run["config"], should_stop=stop_file.exists, on_step=append_row)
    samples = [Sample(**s) for s in json.loads((run_dir / "samples.json").read_text())]
    held = run_dir / HELDOUT_FILE
    heldout = [Sample(**s) for s in json.loads(held.read_text())] if held.is_file() else []
    device = distributed.local_device(run["device"])
    threads = plan_threads(sharing_from_env())
    apply_torch(threads)
    try:
        with ComputeLedger().entry("training", threads):
            result = train(config, _rank_data(run, samples, heldout, device), device)
    finally:
        distributed.shutdown()
    if int(os.environ.get("RANK", "0")) == 0:
        out = {"steps": result.steps, "loss": result.loss,
               "step_accuracy": result.step_accuracy,
               "tokens_per_second": result.tokens_per_second, "seconds": result.seconds,
               "history": result.history, "stop_reason": result.stop_reason,
               "heldout_accuracy": result.heldout_accuracy,
               "heldout_step": result.heldout_step, "eval_seconds": result.eval_seconds}
        (run_dir / "result.json.part").write_text(json.dumps(out))
        (run_dir / "result.json.part").replace(run_dir / "result.json")
    return 0


def _rank_data(run: dict[str, Any], samples: list[Any], heldout: list[Any],
               device: Any) -> Any:
    """The rank's TrainData: from the capture shards when the run names them (the held-out
    split's too, when the run has held-out samples), else the target loaded on the rank's
    device in the run's dtype, which then also runs the held-out samples."""
    from eaglenest.models.target import load_target
    from eaglenest.models.training.shard_source import shard_train_data
    from eaglenest.models.training.train import TrainData

    if run.get("capture"):
        return shard_train_data(run["capture"], device, source=run["source"],
                                heldout=bool(heldout))
    target = load_target(run["target"], device=device, dtype=run.get("dtype", "float32"),
                         aux_layer_ids=run.get("aux_layer_ids"))
    return TrainData(target, samples, source=run["source"], heldout=heldout)


if __name__ == "__main__":
    sys.exit(rank_main(Path(sys.argv[1])))
