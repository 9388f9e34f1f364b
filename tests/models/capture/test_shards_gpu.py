"""Capture shards on CUDA (bf16 autocast, as train() captures there): a head trained from
shards on the GPU matches one trained with the in-process capture. Needs a CUDA device;
also runs as a script (``python tests/models/capture/test_shards_gpu.py``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from eaglenest.models.capture.shards import write_shards
from eaglenest.models.data import encode_examples, load_examples
from eaglenest.models.target import load_target
from eaglenest.models.tiny import build_tiny_target
from eaglenest.models.training.config import TrainConfig
from eaglenest.models.training.shard_source import shard_train_data
from eaglenest.models.training.train import TrainData, train


@pytest.mark.gpu
def test_cuda_training_from_shards_matches_in_process() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target = load_target(build_tiny_target(root / "llama", "LlamaForCausalLM"), "cuda")
        samples = encode_examples(load_examples("gsm8k_training.jsonl")[:12],
                                  target.tokenizer, max_length=160)
        autocast = torch.autocast("cuda", dtype=torch.bfloat16)
        report = write_shards(target, samples, root / "shards", 5, autocast=autocast)
        assert report.written == [0, 1, 2]
        for head in ("eagle3", "peagle"):
            cfg = dict(head=head, max_steps=6, batch_size=3, draft_vocab_size=64,
                       progress=False, lr=2e-3, warmup_steps=2)
            live = train(TrainConfig(**cfg), TrainData(target, samples), "cuda")  # type: ignore[arg-type]
            data = shard_train_data(root / "shards", "cuda")
            shards = train(TrainConfig(**cfg), data, "cuda")  # type: ignore[arg-type]
            live_loss = [h["loss"] for h in live.history]
            shard_loss = [h["loss"] for h in shards.history]
            print(head, "live", live_loss, "\n", head, "shards", shard_loss, flush=True)
            torch.testing.assert_close(shard_loss, live_loss, rtol=1e-3, atol=1e-3)
            ref = live.head.state_dict()
            for k, v in shards.head.state_dict().items():
                torch.testing.assert_close(v, ref[k], rtol=1e-3, atol=1e-3, msg=k)


if __name__ == "__main__":
    test_cuda_training_from_shards_matches_in_process()
    print("cuda shards check passed")
