"""Fixtures for the models/ tests: tiny random targets of all six architectures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from eaglenest.models.data import encode_examples, load_examples
from eaglenest.models.data.template import Sample
from eaglenest.models.target import Target, load_target
from eaglenest.models.tiny import ARCHITECTURES, build_tiny_target

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """arch -> folder of a tiny random model of that architecture (built once)."""
    root = tmp_path_factory.mktemp("tiny-targets")
    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            built[arch] = build_tiny_target(root / arch, arch)
        return built[arch]

    return get


@pytest.fixture(scope="session")
def tiny_target(tiny_dir: Callable[[str], Path]) -> Callable[[str], Target]:
    loaded: dict[str, Target] = {}

    def get(arch: str = "LlamaForCausalLM") -> Target:
        if arch not in loaded:
            loaded[arch] = load_target(tiny_dir(arch))
        return loaded[arch]

    return get


@pytest.fixture(scope="session")
def llama(tiny_target: Callable[[str], Target]) -> Target:
    return tiny_target("LlamaForCausalLM")


@pytest.fixture(scope="session")
def samples(llama: Target) -> list[Sample]:
    examples = load_examples("gsm8k_training.jsonl")[:12]
    return encode_examples(examples, llama.tokenizer, max_length=160)


__all__ = ["ARCHITECTURES"]
