"""A job's training stage in 2 data-parallel processes (torchrun, gloo on the CPU), driven
from the parent by files: checkpoints mirrored as the pointer moves, stop by a stop file,
exact resume, and a rank failure reported with the ranks' log."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from eaglenest.models.data import encode_examples, load_examples
from eaglenest.models.target import load_target
from eaglenest.models.training.config import TrainConfig
from eaglenest.workers.jobs.train_launch import LaunchError, launch, write_run

STEPS = 6


@pytest.fixture(scope="module")
def samples(tiny_llama_dir: Path) -> list:
    target = load_target(tiny_llama_dir)
    return encode_examples(load_examples("gsm8k_training.jsonl")[:8], target.tokenizer, 96)


def config(out: Path, **kw: object) -> TrainConfig:
    base: dict = dict(head="eagle3", max_steps=STEPS, batch_size=1, draft_vocab_size=64,
                      lr=2e-3, warmup_steps=2, checkpoint_every=2, progress=False)
    base.update(kw)
    return TrainConfig(out_dir=str(out), **base)


def test_two_processes_train_and_mirror_each_checkpoint(tmp_path, tiny_llama_dir, samples):
    run = write_run(tmp_path / "ddp", config(tmp_path / "train"), tiny_llama_dir, "cpu",
                    "gsm8k", samples)
    mirrored: list[str] = []
    result = launch(run, 2, lambda: False, lambda p: mirrored.append(p.name))
    assert result["steps"] == STEPS
    assert [row["step"] for row in result["history"]] == list(range(1, STEPS + 1))
    assert mirrored and mirrored[-1] == (tmp_path / "train/checkpoints/latest").read_text()
    assert len(set(mirrored)) == len(mirrored)  # each checkpoint handed over once
    assert (tmp_path / "train" / "model.safetensors").is_file()
    provenance = json.loads((tmp_path / "train" / "provenance.json").read_text())
    assert provenance["steps"] == STEPS


def test_two_processes_measure_the_held_out_accuracy(tmp_path, tiny_llama_dir, samples):
    """Each rank runs the held-out samples every eval_every steps (and at the last): the
    rows and the result carry the figures, and the plateau rule can stop the ranks."""
    run = write_run(tmp_path / "ddp", config(tmp_path / "train", eval_every=3),
                    tiny_llama_dir, "cpu", "gsm8k", samples[2:], heldout=samples[:2])
    result = launch(run, 2, lambda: False, None)
    rows = [(r["step"], r["heldout_accuracy"]) for r in result["history"]
            if "heldout_accuracy" in r]
    assert [step for step, _ in rows] == [3, 6]
    assert all(len(acc) == 3 and all(0.0 <= a <= 1.0 for a in acc) for _, acc in rows)
    assert result["heldout_accuracy"] == rows[-1][1] and result["heldout_step"] == STEPS
    assert result["stop_reason"] == "max steps" and result["eval_seconds"] > 0


def test_stop_file_ends_all_ranks_with_a_checkpoint_then_resume_continues(
        tmp_path, tiny_llama_dir, samples):
    long = 400  # more steps than the tiny model runs between two polls of the parent
    out = tmp_path / "train"
    mirrored: list[str] = []
    run = write_run(tmp_path / "ddp", config(out, max_steps=long), tiny_llama_dir, "cpu",
                    "gsm8k", samples)
    first = launch(run, 2, lambda: bool(mirrored), lambda p: mirrored.append(p.name))
    assert 2 <= first["steps"] < long  # stopped once the first checkpoint was mirrored
    assert (tmp_path / "ddp" / "stop").exists()
    assert mirrored[-1] == f"step-{first['steps']:08d}"  # the stop's checkpoint, mirrored
    run = write_run(tmp_path / "ddp", config(out, max_steps=long, resume=True),
                    tiny_llama_dir, "cpu", "gsm8k", samples)
    assert not (tmp_path / "ddp" / "stop").exists()  # a new run clears the old stop
    resumed = launch(run, 2, lambda: False, None)
    assert resumed["steps"] == long
    assert [r["step"] for r in resumed["history"]] == list(range(1, long + 1))


def test_a_failing_rank_raises_with_the_log_tail(tmp_path, samples):
    run = write_run(tmp_path / "ddp", config(tmp_path / "train"), tmp_path / "no-such-model",
                    "cpu", "gsm8k", samples)
    with pytest.raises(LaunchError) as exc:
        launch(run, 2, lambda: False, None)
    assert "2 training processes exited with status 1" in str(exc.value)
    assert "no-such-model" in str(exc.value)


def test_a_launch_first_stops_what_the_previous_launch_left(tmp_path):
    """A resumed job never runs beside its predecessor's ranks: launcher.json names the
    previous torchrun; its whole tree is stopped (and waited for) before a new one starts,
    and a predecessor on another host makes the launch refuse."""
    import dataclasses

    from eaglenest.foundation.host import children
    from eaglenest.workers.jobs.train_launch import LAUNCHER, stop_predecessor

    proc, record = children.spawn(["bash", "-c", "sleep 300 & setsid sleep 300 & wait"],
                                  role="torchrun", resource="job:resumed")
    try:
        deadline = time.monotonic() + 10
        while len(record.running()) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (tmp_path / LAUNCHER).write_text(json.dumps(record.to_dict()))
        stop_predecessor(tmp_path)
        assert record.running() == [] and not (tmp_path / LAUNCHER).exists()
        elsewhere = dataclasses.replace(record, host="another-host")
        (tmp_path / LAUNCHER).write_text(json.dumps(elsewhere.to_dict()))
        with pytest.raises(LaunchError, match="ran on host another-host"):
            stop_predecessor(tmp_path)
    finally:
        children.stop(record, timeout=1, proc=proc)


def test_two_processes_train_a_block_head_over_the_layers_asked(tmp_path, tiny_llama_dir,
                                                                samples):
    """A DFlash head (HeadSpec.block) in 2 processes, each rank's target capturing the
    layers the run names (a starting head's: workers/jobs/job_target.py start_layers), not
    the default ones: the head reads those layers and its block is the run's."""
    run = write_run(tmp_path / "ddp", config(tmp_path / "train", head="dflash",
                                             dflash_block_size=4, dflash_layers=1,
                                             checkpoint_every=0),
                    tiny_llama_dir, "cpu", "gsm8k", samples, aux_layer_ids=[1, 4])
    assert json.loads(run.read_text())["aux_layer_ids"] == [1, 4]
    result = launch(run, 2, lambda: False, None)
    assert result["steps"] == STEPS and len(result["step_accuracy"]) == 3  # block 4: 3 slots
    saved = json.loads((tmp_path / "train" / "config.json").read_text())
    assert saved["dflash_config"]["target_layer_ids"] == [0, 3]  # aux [1, 4]
    assert saved["dflash_config"]["block_size"] == 4 and saved["num_hidden_layers"] == 1
