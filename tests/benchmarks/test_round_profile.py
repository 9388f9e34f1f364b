"""benchmarks/round_profile.py on the tiny random Llama target: the op classifier, and a
profiled decode whose matrix, other-op and outside-op parts add up to the profiled round."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from benchmarks import round_profile
from eaglenest.models.data.template import Sample
from eaglenest.models.decode.engine import SpeculativeEngine
from eaglenest.models.decode.kernels import KernelPolicy
from eaglenest.models.decode.modes import DecodeMode
from eaglenest.models.heads.registry import HEADS
from eaglenest.models.target import load_target
from eaglenest.models.training.config import TrainConfig


@pytest.mark.parametrize(("name", "matrix"), [
    ("aten::addmm", True), ("aten::mm", True), ("mkldnn::_linear_pointwise", True),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", True), ("aten::bmm", True),
    ("aten::cat", False), ("aten::copy_", False), ("aten::argmax", False),
    ("aten::mul", False), ("aten::index", False),
])
def test_is_matrix(name: str, matrix: bool) -> None:
    assert round_profile.is_matrix(name) is matrix


def test_a_profiled_chain_round_splits_into_its_parts(tiny_llama_dir: Path) -> None:
    torch.set_num_threads(2)
    target = load_target(tiny_llama_dir)
    rng = random.Random(0)
    vocab = int(target.model.config.vocab_size)
    samples = [Sample([rng.randrange(vocab) for _ in range(64)], [0] * 4 + [1] * 60)
               for _ in range(2)]
    torch.manual_seed(0)
    head = HEADS["eagle3"].build(target, samples, TrainConfig(head="eagle3",
                                                              draft_vocab_size=64)).eval()
    built = {"chain K=3": SpeculativeEngine(target.model, head, DecodeMode.CHAIN, k=3),
             "transformers": SpeculativeEngine(target.model, head, DecodeMode.CHAIN, k=3,
                                               kernels=KernelPolicy(fuse=False),
                                               direct=False)}
    prompts = [[5, 17, 42, 9, 88, 3], [7, 7, 21, 60]]
    splits = round_profile.timed(built, prompts, 12)
    split = round_profile.profiled(splits["chain K=3"], built["chain K=3"], prompts, 12)
    slow = round_profile.profiled(splits["transformers"], built["transformers"], prompts, 12)
    assert split.rounds == slow.rounds > 0 and split.tokens == slow.tokens == 24
    assert split.ops_per_round < slow.ops_per_round  # the direct forward: fewer op calls
    assert split.ms_per_round > 0 and split.profiled_ms > 0
    assert split.matrix_ms > 0 and split.other_ms > 0 and split.ops_per_round > 10
    assert split.matrix_ms + split.other_ms <= split.profiled_ms * 1.05
    assert split.top_other and all(not round_profile.is_matrix(k) for k, _ in split.top_other)
    text = round_profile.table([split])
    assert text.splitlines()[2].startswith("| chain K=3 | ")
