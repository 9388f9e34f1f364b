"""What the head benchmarks share: the training / held-out split of the built-in datasets,
the evaluation prompts, and the training recipe they run.

Light on purpose (models/ only, no vLLM, no service): the GPU check's head race imports it on
a device that has torch and transformers alone.
"""

from __future__ import annotations

from typing import Any

from eaglenest.models.data import BUILTIN_NAMES, Chat, Example, load_examples
from eaglenest.models.data.split import held_out_split
from eaglenest.models.target import Target
from eaglenest.models.training.config import TrainConfig


def split_builtin(held_out: int) -> tuple[list[Example], list[Example]]:
    """(training examples, held-out examples): ``held_out`` of every built-in file,
    without the training examples that ask a held-out question (the job's rule,
    models/data/split.py: ultrachat repeats its first questions)."""
    train_ex, eval_ex = [], []
    for name in BUILTIN_NAMES:
        kept, held, _ = held_out_split(load_examples(name), held_out)
        train_ex += kept
        eval_ex += held
    return train_ex, eval_ex


def first_user_prompt(example: Example, target: Target) -> str:
    """The chat-templated text of the example's first user turn (generation prompt added)."""
    if isinstance(example, Chat):
        msgs = [m for m in example.messages if m["role"] == "system"]
        msgs.append(next(m for m in example.messages if m["role"] == "user"))
    else:
        msgs = [{"role": "user", "content": example.prompt}]
    return str(target.tokenizer.apply_chat_template(msgs, add_generation_prompt=True,
                                                     tokenize=False))


def train_config(kind: str, **kw: Any) -> TrainConfig:
    """The benchmarks' recipe for ``kind`` (batch 2, lr 1e-3, an 8192-token draft vocabulary,
    TrainConfig's defaults otherwise), with ``kw`` TrainConfig fields on top."""
    base: dict[str, Any] = dict(head=kind, batch_size=2, lr=1e-3, warmup_steps=20,
                                draft_vocab_size=8192, progress=False, seed=0)
    base.update(kw)
    return TrainConfig(**base)
