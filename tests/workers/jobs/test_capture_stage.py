"""EAGLENEST_CAPTURE_BACKEND in the optimization pipeline (workers/jobs/capture_stage.py):
the pipeline run in this process on the tiny target with a local store (no stack), the
benchmark off. hf (capture shards, then training from them) trains the same head as the
in-process capture; the shards go at the job's end unless EAGLENEST_KEEP_CAPTURE=1; a
shutdown hand-back keeps them and the re-run reuses them."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from eaglenest.foundation.environment import Kind, classify
from eaglenest.foundation.shapes import rebuild
from eaglenest.foundation.shapes.optimization_jobs import CreateOptimizationJobRequest
from eaglenest.foundation.storage import LocalStore, parse_uri
from eaglenest.workers.jobs.control import JobStopped
from eaglenest.workers.jobs.inputs import JobSources
from eaglenest.workers.jobs.options import OptionError, parse_options
from eaglenest.workers.jobs.pipeline import Pipeline
from eaglenest.workers.jobs.progress import describe
from tests.support.jobs import job

ENV = {"EAGLENEST_MAX_STEPS": "4", "EAGLENEST_MAX_LENGTH": "128",
       "EAGLENEST_DATASET": "gsm8k_training.jsonl", "EAGLENEST_HOLDOUT": "2",
       "EAGLENEST_BENCHMARK": "0", "EAGLENEST_CHECKPOINT_EVERY": "0",
       "EAGLENEST_CAPTURE_SHARD_SAMPLES": "16", "EAGLENEST_DEVICE": "cpu"}


class Control:
    """JobControl's surface for the pipeline; ``stop_after`` capture records: JobStopped."""

    def __init__(self, stop_after: int | None = None, reason: str = "shutdown") -> None:
        self.records: list[dict[str, Any]] = []
        self.stop_after, self.reason = stop_after, reason

    def check(self) -> None:
        shards = [r for r in self.records if "shard" in r]
        if self.stop_after is not None and len(shards) >= self.stop_after:
            raise JobStopped(self.reason)

    def report(self, progress: dict[str, Any]) -> None:
        self.records.append(progress)

    def should_stop(self) -> bool:
        return False


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> LocalStore:
    s = LocalStore(tmp_path_factory.mktemp("s3"))
    for f in tiny_llama_dir.iterdir():
        s.put_file(parse_uri(f"s3://models/tiny-llama/{f.name}"), f)
    return s


def _pipeline(store: LocalStore, work: Path, name: str, control: Control | None = None,
              **env: str) -> Pipeline:
    variables = {**ENV, **env}
    spec = rebuild(CreateOptimizationJobRequest, {"OptimizationJobName": name,
                                                  **job("s3://models/tiny-llama/", **variables)})
    sources = JobSources("s3://models/tiny-llama/", None, None, "builtin")
    return Pipeline(name, spec, parse_options(variables), sources, store, work,
                    control or Control())  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def in_process(store: LocalStore, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("auto")
    result = _pipeline(store, work, "auto-job").run()
    assert result.train["capture"] == {"backend": "in-process",
                                       "cache_bytes": result.train["capture"]["cache_bytes"]}
    return work


def _out(store: LocalStore, name: str) -> Path:
    return store.root / "output" / "jobs" / name


def test_hf_capture_trains_the_same_head(store, in_process, tmp_path, caplog):
    control = Control()
    with caplog.at_level(logging.INFO, logger="eaglenest.optimize"):
        result = _pipeline(store, tmp_path, "hf-job", control,
                           EAGLENEST_CAPTURE_BACKEND="hf").run()
    hf, auto = _out(store, "hf-job"), _out(store, "auto-job")
    a = load_file(hf / "eagle_model" / "model.safetensors")
    b = load_file(auto / "eagle_model" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    losses = [[json.loads(x)["loss"] for x in (d / "training_log.jsonl").read_text().splitlines()]
              for d in (hf, auto)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    # stage, progress per shard (40 training samples in shards of 16: 3 shards)
    stages = [r["stage"] for r in control.records if set(r) == {"stage", "updated"}]
    assert "capture hidden states" in stages
    shards = [r for r in control.records if "shard" in r]
    assert [(r["shard"], r["shards"], r["samples"]) for r in shards] == [
        (1, 3, 16), (2, 3, 32), (3, 3, 40)]
    lines = [r.getMessage() for r in caplog.records if "capture: shard" in r.getMessage()]
    assert len(lines) == 3 and describe(shards[-1]) in lines[-1]
    assert "samples/s" in lines[0] and "ETA" in lines[0]
    # provenance: the head's and the job's
    for prov in (hf / "eagle_model" / "provenance.json", hf / "provenance.json"):
        record = json.loads(prov.read_text())
        cap = record.get("capture") or record["train"]["capture"]
        assert cap["backend"] == "hf" and cap["shards"] == 3 and cap["cache_bytes"] > 0
        assert cap["target"]["architecture"] == "LlamaForCausalLM"
    head_prov = json.loads((auto / "eagle_model" / "provenance.json").read_text())
    assert head_prov["capture"]["backend"] == "in-process"
    assert result.train["capture"]["cache_bytes"] > 0
    # the shards went at the job's end, and were not published
    assert not (tmp_path / "capture").exists()
    assert not (hf / "capture").exists()


def test_keep_capture_publishes_the_shards(store, tmp_path):
    _pipeline(store, tmp_path, "keep-job", EAGLENEST_CAPTURE_BACKEND="hf",
              EAGLENEST_KEEP_CAPTURE="1", EAGLENEST_MAX_STEPS="1").run()
    kept = _out(store, "keep-job") / "capture"
    manifest = json.loads((kept / "manifest.json").read_text())
    assert all(s["complete"] for s in manifest["shards"]) and len(manifest["shards"]) == 3
    assert (kept / "shard-00002.safetensors").is_file()


def test_shutdown_keeps_the_shards_and_the_rerun_reuses_them(store, tmp_path, caplog):
    env = {"EAGLENEST_CAPTURE_BACKEND": "hf", "EAGLENEST_MAX_STEPS": "1"}
    with pytest.raises(JobStopped):
        _pipeline(store, tmp_path, "resumed", Control(stop_after=2), **env).run()
    manifest = json.loads((tmp_path / "capture" / "manifest.json").read_text())
    assert [s["complete"] for s in manifest["shards"]] == [True, True, False]
    control = Control()
    with caplog.at_level(logging.INFO, logger="eaglenest.optimize"):
        _pipeline(store, tmp_path, "resumed", control, **env).run()
    assert "capture: reusing 2 finished shard(s) of 3" in caplog.text
    assert [r["shard"] for r in control.records if "shard" in r] == [3]  # one written
    assert not (tmp_path / "capture").exists()


def test_a_stopped_job_deletes_the_shards(store, tmp_path):
    with pytest.raises(JobStopped):
        _pipeline(store, tmp_path, "stopped", Control(stop_after=1, reason="stopped"),
                  EAGLENEST_CAPTURE_BACKEND="hf").run()
    assert not (tmp_path / "capture").exists()


def test_capture_options():
    assert parse_options({}).capture_backend == "auto"
    assert parse_options({}).capture_shard_samples == 64
    assert parse_options({}).keep_capture is False
    with pytest.raises(OptionError, match=r"EAGLENEST_CAPTURE_BACKEND='x' must be one of auto, "
                                          r"hf, vllm"):
        parse_options({"EAGLENEST_CAPTURE_BACKEND": "x"})
    with pytest.raises(OptionError, match=r"^EAGLENEST_CAPTURE_BACKEND=vllm is not supported"):
        parse_options({"EAGLENEST_CAPTURE_BACKEND": "vllm"})
    with pytest.raises(OptionError, match="EAGLENEST_CAPTURE_SHARD_SAMPLES"):
        parse_options({"EAGLENEST_CAPTURE_SHARD_SAMPLES": "0"})
    with pytest.raises(OptionError, match="EAGLENEST_KEEP_CAPTURE='yes' must be 0 or 1"):
        parse_options({"EAGLENEST_KEEP_CAPTURE": "yes"})
    for name in ("EAGLENEST_CAPTURE_BACKEND", "EAGLENEST_CAPTURE_SHARD_SAMPLES",
                 "EAGLENEST_KEEP_CAPTURE"):
        assert classify(name) == Kind.KNOWN


def test_data_parallel_ranks_read_the_shards(store, tmp_path):
    """EAGLENEST_TRAIN_PROCESSES=2 (torchrun, gloo): the ranks train from the shards and
    never load the target (no transformers weight loading in their log)."""
    result = _pipeline(store, tmp_path, "ddp-hf", EAGLENEST_CAPTURE_BACKEND="hf",
                       EAGLENEST_TRAIN_PROCESSES="2", EAGLENEST_MAX_STEPS="2").run()
    assert result.train["processes"] == 2 and result.train["steps"] == 2
    assert result.train["capture"]["backend"] == "hf"
    run = json.loads((tmp_path / "ddp" / "run.json").read_text())
    assert run["capture"] == str(tmp_path / "capture")
    assert "Loading weights" not in (tmp_path / "ddp" / "ranks.log").read_text()
    assert not (tmp_path / "capture").exists()
