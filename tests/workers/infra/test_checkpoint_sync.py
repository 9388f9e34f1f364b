"""Checkpoints mirrored to the store: a second host (empty work dir) resumes exactly."""

from __future__ import annotations

from pathlib import Path

import torch

from eaglenest.foundation.store.storage import LocalStore, parse_uri
from eaglenest.workers.infra.checkpoint_sync import CheckpointSync


def _train(target, samples, out: Path, **kw):  # noqa: ANN001, ANN003, ANN202
    from eaglenest.models.training.config import TrainConfig
    from eaglenest.models.training.train import TrainData, train

    cfg = TrainConfig(head="eagle3", out_dir=str(out), max_steps=6, draft_vocab_size=64,
                      progress=False, lr=2e-3, warmup_steps=2, **kw)
    return train(cfg, TrainData(target, samples))


def test_second_host_resumes_from_the_uploaded_checkpoint(tiny_llama_dir, tmp_path):
    from eaglenest.models.data import encode_examples, load_examples
    from eaglenest.models.target import load_target

    target = load_target(tiny_llama_dir)
    samples = encode_examples(load_examples("magicoder.jsonl")[:6], target.tokenizer, 96)
    store = LocalStore(tmp_path / "s3")
    sync = CheckpointSync(store, "s3://out/jobs/j/_checkpoints/")
    straight = _train(target, samples, tmp_path / "straight")

    # host A: checkpoints every 2 steps, uploaded; it dies after step 3 (stop_after)
    _train(target, samples, tmp_path / "hostA", checkpoint_every=2, stop_after=3,
           on_checkpoint=sync.upload)
    keys = store.list_keys(parse_uri("s3://out/jobs/j/_checkpoints/"))
    assert sync.remote_latest() == "step-00000003"
    assert {k.split("/")[3] for k in keys} == {"latest", "step-00000003"}  # step 2 deleted

    # host B: empty work dir -> restore, then resume to the end
    host_b = tmp_path / "hostB"
    assert sync.restore(host_b)
    resumed = _train(target, samples, host_b, resume=True)
    assert resumed.steps == 6
    for k, v in straight.head.state_dict().items():
        assert torch.equal(v, resumed.head.state_dict()[k]), k
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in straight.history]

    sync.clear()
    assert store.list_keys(parse_uri("s3://out/jobs/j/_checkpoints/")) == []
    assert not CheckpointSync(store, "s3://out/jobs/j/_checkpoints/").restore(tmp_path / "c")
