"""EAGLENEST_CAPTURE_BACKEND in the optimization pipeline (workers/jobs/capture_stage.py):
the pipeline run in this process on the tiny target with a local store (no stack), the
benchmark off. hf (capture shards, then training from them) trains the same head as the
in-process capture, and logs the same held-out accuracy (read from the held-out split); the
shards go at the job's end unless EAGLENEST_KEEP_CAPTURE=1; a shutdown hand-back keeps
them and the re-run reuses them; a held-out split of another plan is captured again."""

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
from eaglenest.foundation.store.storage import LocalStore, parse_uri
from eaglenest.workers.infra.model_fetch import InputError
from eaglenest.workers.jobs import capture_stage
from eaglenest.workers.jobs.control import JobStopped
from eaglenest.workers.jobs.inputs import JobSources
from eaglenest.workers.jobs.options import OptionError, parse_options
from eaglenest.workers.jobs.pipeline import Pipeline
from eaglenest.workers.jobs.progress import describe
from tests.support.jobs import job

ENV = {"EAGLENEST_MAX_STEPS": "4", "EAGLENEST_MAX_LENGTH": "128",
       "EAGLENEST_DATASET": "gsm8k_training.jsonl", "EAGLENEST_HOLDOUT": "2",
       "EAGLENEST_BENCHMARK": "0", "EAGLENEST_CHECKPOINT_EVERY": "0",
       "EAGLENEST_CAPTURE_SHARD_SAMPLES": "16", "EAGLENEST_DEVICE": "cpu",
       # the data as written, the steps asked for (as tests/support/jobs.py)
       "EAGLENEST_REGENERATE": "0", "EAGLENEST_PLATEAU_EVALS": "0",
       "EAGLENEST_MAX_TRAIN_MINUTES": "0",
       # each job captures (tests/workers/jobs/test_shard_cache.py: the shard cache)
       "EAGLENEST_SHARD_CACHE": "0"}


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
    # on the CPU the head is exported as trained: float32, and says so
    assert head_prov["dtype"] == "float32" and {t.dtype for t in b.values()
                                                if t.is_floating_point()} == {torch.float32}
    assert json.loads((auto / "eagle_model" / "config.json").read_text())["torch_dtype"] \
        == "float32"
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
    assert parse_options({"EAGLENEST_CAPTURE_BACKEND": "vllm"}).capture_backend == "vllm"


GIB = 2**30


def test_auto_captures_in_process_while_the_target_fits_one_gpu():
    choose = capture_stage.choose_backend
    assert choose("auto", "cpu", 500 * GIB, 0, True) == "in-process"  # the CPU: always
    assert choose("auto", "cuda", 16 * GIB, 80 * GIB, False) == "in-process"
    assert choose("auto", "cuda", 48 * GIB, 80 * GIB, True) == "in-process"  # 60%: fits
    assert choose("auto", "cuda", 49 * GIB, 80 * GIB, True) == "vllm"
    assert choose("auto", "cuda", 64 * GIB, 80 * GIB, True) == "vllm"
    assert choose("hf", "cuda", 64 * GIB, 80 * GIB, True) == "hf"  # asked for: kept
    assert choose("vllm", "cpu", GIB, 0, True) == "vllm"


def test_vllm_without_vllm_installed_is_an_input_error():
    with pytest.raises(InputError, match=r"^EAGLENEST_CAPTURE_BACKEND=vllm \(asked for\) "
                                         r"needs vLLM installed on the worker"):
        capture_stage.choose_backend("vllm", "cpu", GIB, 0, False)
    with pytest.raises(InputError, match=r"\(auto: the target's 64.0 GiB of weights take more "
                                         r"than 60% of one GPU's 80.0 GiB\) needs vLLM"):
        capture_stage.choose_backend("auto", "cuda", 64 * GIB, 80 * GIB, False)
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
    # the held-out split was captured too, and the ranks measured it at the last step
    assert result.train["heldout_step"] == 2 and len(result.train["heldout_accuracy"]) == 3
    assert [step for step, _ in _heldout_rows(_out(store, "ddp-hf"))] == [2]


def _heldout_rows(out: Path) -> list[tuple[int, list[float]]]:
    rows = [json.loads(x) for x in (out / "training_log.jsonl").read_text().splitlines()]
    return [(r["step"], r["heldout_accuracy"]) for r in rows if r.get("heldout_accuracy")]


def test_hf_job_logs_the_held_out_accuracy_of_the_in_process_job(store, in_process, tmp_path):
    """The held-out samples are captured as the held-out split and the accuracy is read
    from there: the same figures as the in-process job (which runs the live target)."""
    result = _pipeline(store, tmp_path, "hf-heldout", EAGLENEST_CAPTURE_BACKEND="hf",
                       EAGLENEST_KEEP_CAPTURE="1").run()
    hf, auto = _heldout_rows(_out(store, "hf-heldout")), _heldout_rows(_out(store, "auto-job"))
    assert [step for step, _ in hf] == [step for step, _ in auto] == [4]
    assert hf[0][1] == pytest.approx(auto[0][1], abs=1e-5)
    assert result.train["heldout_step"] == 4 and result.train["heldout_accuracy"]
    assert result.train["capture"]["heldout_shards"] == 1
    kept = _out(store, "hf-heldout") / "capture"
    manifest = json.loads((kept / "heldout-manifest.json").read_text())
    assert manifest["split"] == "heldout" and manifest["num_samples"] == 2
    assert all(s["complete"] for s in manifest["shards"])


def test_a_held_out_split_of_another_plan_is_captured_again(tiny_llama_dir, tmp_path, caplog):
    from eaglenest.models.capture.shards import HELDOUT, read_manifest
    from eaglenest.models.data import encode_examples, load_examples
    from eaglenest.models.target import load_target

    target = load_target(tiny_llama_dir)
    encoded = encode_examples(load_examples("gsm8k_training.jsonl")[:8], target.tokenizer, 128)
    train, held, records = encoded[:5], encoded[5:], []
    info = capture_stage.capture(tmp_path, target, train, 4, "j", records.append,
                                 lambda: None, held)
    assert (info.shards, info.heldout_shards, len(records)) == (2, 1, 2)
    assert read_manifest(tmp_path, HELDOUT)["num_samples"] == len(held)
    again = capture_stage.capture(tmp_path, target, train, 4, "j", records.append,
                                  lambda: None, held)
    assert again.reused == 2 and len(records) == 2  # the same plan: nothing captured
    with caplog.at_level(logging.WARNING, logger="eaglenest.optimize"):
        other = capture_stage.capture(tmp_path, target, train, 4, "j", records.append,
                                      lambda: None, held[:1])
    assert "(heldout split) was made with num_samples" in caplog.text
    assert other.reused == 0 and len(records) == 4  # both splits captured again
    assert read_manifest(tmp_path, HELDOUT)["num_samples"] == 1
