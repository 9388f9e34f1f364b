"""A block head (HeadSpec.block: DFlash) served by either backend: the speculative config
names the head's vLLM method and K is capped by the head's block (block_size - 1), for a
fixed K and for a schedule; other heads keep the K asked. The heads are real checkpoints
(models.checkpoint.save_head) of heads built on the tiny Llama target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglenest.models.heads.registry import HEADS
from eaglenest.workers.model_servers.process import (
    EMBEDDED,
    VLLM,
    ServerSpec,
    head_draft_limit,
    head_method,
)
from eaglenest.workers.model_servers.schedule import Schedule

BLOCK_KINDS = [k for k, s in HEADS.items() if s.block]
BLOCK = 8


def save_block_head(target_dir: Path, out: Path, kind: str, block: int = BLOCK,
                    layers: int = 1) -> Path:
    """A freshly built (untrained) head of block kind `kind` on the target in `target_dir`,
    saved as an endpoint would serve it (native format)."""
    import torch

    from eaglenest.models.checkpoint import save_head
    from eaglenest.models.data import builtin_path, encode_examples, load_examples
    from eaglenest.models.target import load_target
    from eaglenest.models.training.config import TrainConfig

    target = load_target(target_dir)
    samples = encode_examples(load_examples(builtin_path("gsm8k_training.jsonl"))[:8],
                              target.tokenizer, max_length=128)
    torch.manual_seed(0)
    config = TrainConfig(head=kind, draft_vocab_size=64, dflash_block_size=block,
                         dflash_layers=layers)
    head = HEADS[kind].build(target, samples, config).eval()
    return save_head(head, out, verifier=str(target_dir), fmt="native",
                     speculative_tokens=block - 1)


@pytest.fixture(scope="module", params=BLOCK_KINDS)
def block_head(request: pytest.FixtureRequest, tiny_llama_dir: Path,
               tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    kind: str = request.param
    return kind, save_block_head(tiny_llama_dir, tmp_path_factory.mktemp(kind) / "head", kind)


def _spec(target: Path, head: Path | None, backend: str, k: int,
          schedule: Schedule | None = None) -> ServerSpec:
    return ServerSpec(model_dir=target, served_name="m", port=8000, backend=backend,
                      head_dir=head, num_speculative_tokens=k, schedule=schedule)


def test_the_block_bounds_k(block_head: tuple[str, Path], tiny_llama_dir: Path) -> None:
    kind, head = block_head
    assert head_draft_limit(head) == BLOCK - 1
    assert head_method(head) == {"method": HEADS[kind].vllm_method}
    for asked, served in ((3, 3), (BLOCK - 1, BLOCK - 1), (12, BLOCK - 1)):
        config = _spec(tiny_llama_dir, head, VLLM, asked).vllm_speculative_config()
        assert config == {"method": HEADS[kind].vllm_method, "model": str(head),
                          "num_speculative_tokens": served}
        cmd = _spec(tiny_llama_dir, head, EMBEDDED, asked).command()
        assert cmd[cmd.index("--num-speculative-tokens") + 1] == str(served)


def test_a_schedule_is_capped_by_the_block(block_head: tuple[str, Path],
                                            tiny_llama_dir: Path) -> None:
    _, head = block_head
    schedule = Schedule(((1, 12), (4, 3), (16, 0)))
    spec = _spec(tiny_llama_dir, head, EMBEDDED, 5, schedule)
    assert spec.served_schedule() == Schedule(((1, BLOCK - 1), (4, 3), (16, 0)))
    cmd = spec.command()
    assert cmd[cmd.index("--num-speculative-tokens") + 1] == str(BLOCK - 1)
    assert json.loads(cmd[cmd.index("--speculation-schedule") + 1]) == [
        [1, BLOCK - 1], [4, 3], [16, 0]]
    vllm = _spec(tiny_llama_dir, head, VLLM, 5, schedule)
    vllm.expected_load = 1
    config = vllm.vllm_speculative_config()
    assert config is not None and config["num_speculative_tokens"] == BLOCK - 1
    if "num_speculative_tokens_per_batch_size" in config:  # vLLM's dynamic speculation
        assert max(k for _, _, k in config["num_speculative_tokens_per_batch_size"]) \
            == BLOCK - 1


def test_other_heads_keep_the_k_asked(tiny_eagle3_dir: Path, tiny_llama_dir: Path) -> None:
    assert head_draft_limit(tiny_eagle3_dir) is None
    spec = _spec(tiny_llama_dir, tiny_eagle3_dir, VLLM, 12, Schedule(((1, 12), (4, 3))))
    assert spec.served_schedule() == spec.schedule
    spec.schedule = None
    assert spec.vllm_speculative_config() == {"method": "eagle3", "model": str(tiny_eagle3_dir),
                                              "num_speculative_tokens": 12}
