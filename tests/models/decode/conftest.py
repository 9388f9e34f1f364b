"""Fixtures for the decoding tests: random heads of each kind and oracle draft sources."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from eaglenest.models.data.template import Sample
from eaglenest.models.heads.registry import HEADS
from eaglenest.models.target import Target
from eaglenest.models.training.config import TrainConfig


@pytest.fixture(scope="session")
def make_head(samples: list[Sample]) -> Callable[[Target, str], nn.Module]:
    """(target, kind) -> a random-initialised head of that kind for the target (cached).

    ``kind`` may name a layer count: "eagle3@2" is a two-layer EAGLE-3 head."""
    built: dict[tuple[int, str], nn.Module] = {}

    def get(target: Target, kind: str) -> nn.Module:
        key = (id(target), kind)
        if key not in built:
            torch.manual_seed(0)
            name, _, layers = kind.partition("@")
            cfg = TrainConfig(head=name, draft_vocab_size=64, num_layers=int(layers or 1))
            built[key] = HEADS[name].build(target, samples, cfg).eval()
        return built[key]

    return get
