"""Regeneration by a vLLM child (workers/jobs/vllm_regenerate.py), on the real SmolLM2-135M
target against the transformers regeneration of the same examples (models/data/regenerate.py),
greedy, float32 on the CPU. Runs only with ``-m vllm``.

Multi-turn chats go round by round (turn 2 conditions on the rewritten turn 1), so the two
engines see the same prompts as long as they agree; greedy decoding of float32 matmuls in
different kernels may still part at a near-tie, so the test asks for every turn's first
tokens to agree and most turns to agree whole (and reports how many did).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglenest.foundation.host import children
from eaglenest.models.data import Chat, load_examples
from eaglenest.models.data.regenerate import regenerate
from eaglenest.models.prepare import cached_smollm2
from eaglenest.models.target import load_target
from eaglenest.workers.jobs import vllm_regenerate
from eaglenest.workers.jobs.control import JobStopped
from eaglenest.workers.model_servers.process import vllm_installed

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed"),
]

MAX_NEW = 24


def _run(smollm2: Path) -> dict[str, object]:
    return {"model": str(smollm2), "device": "cpu", "dtype": "float32",
            "tensor_parallel_size": 1, "seed": 0, "max_new_tokens": MAX_NEW,
            "temperature": 0.0}


def _texts(examples: list) -> list[str]:  # type: ignore[type-arg]
    return [m["content"] for e in examples if isinstance(e, Chat) for m in e.messages
            if m["role"] == "assistant"] + [e.completion for e in examples
                                             if not isinstance(e, Chat)]


def test_vllm_regenerates_what_transformers_does(tmp_path: Path) -> None:
    smollm2 = cached_smollm2()
    examples = (load_examples("gsm8k_training.jsonl")[:3]
                + [e for e in load_examples("ultrachat_0_8k_515292.jsonl")
                   if isinstance(e, Chat) and len(e.messages) >= 4][:2])
    reports: list[tuple[int, int]] = []
    ours = vllm_regenerate.regenerate(examples, _run(smollm2), tmp_path / "regen",
                                      lambda done, total: reports.append((done, total)))
    ref = regenerate(examples, load_target(smollm2), MAX_NEW, keep_empty=True)
    assert [type(e) for e in ours] == [type(e) for e in ref]
    assert [[m["role"] for m in e.messages] for e in ours if isinstance(e, Chat)] == [
        [m["role"] for m in e.messages] for e in ref if isinstance(e, Chat)]
    a, b = _texts(ours), _texts(ref)
    assert len(a) == len(b) >= 7 and all(a)
    assert all(x.split()[:3] == y.split()[:3] for x, y in zip(a, b, strict=True)), (a, b)
    same = sum(x == y for x, y in zip(a, b, strict=True))
    print(f"{same}/{len(a)} turns equal")
    assert same >= len(a) - 1
    assert reports and reports[-1] == (len(a), len(a))
    assert [d for d, _ in reports] == sorted(d for d, _ in reports)


def test_a_stop_ends_the_regenerating_engine(tmp_path: Path) -> None:
    """A stop while the engine starts: the child and everything under it are gone, the
    children_dir forgets it, no answers come back."""
    children_dir = tmp_path / "children"
    children_dir.mkdir()
    tags: list[str] = []

    def check() -> None:
        tags.extend(r.tag for r in children.records(children_dir))
        raise JobStopped("stopped")

    with pytest.raises(JobStopped):
        vllm_regenerate.regenerate(load_examples("gsm8k_training.jsonl")[:4],
                                   _run(cached_smollm2()), tmp_path / "regen",
                                   lambda done, total: None, check=check,
                                   children_dir=children_dir, resource="job:t")
    assert len(tags) == 1 and children.tagged(tags[0]) == []
    assert children.records(children_dir) == []
    assert not (tmp_path / "regen.out.jsonl").exists()
