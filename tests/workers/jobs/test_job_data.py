"""The job's held-out split (workers/jobs/job_data.py ``split``): the rule of
models/data/split.py, a log line for what leaves training, an InputError for nothing left."""

from __future__ import annotations

import logging

import pytest

from eaglenest.models.data import Chat, builtin_path, load_examples
from eaglenest.workers.jobs.inputs import InputError
from eaglenest.workers.jobs.job_data import split


def chat(question: str) -> Chat:
    return Chat([{"role": "user", "content": question}, {"role": "assistant", "content": "ok"}])


def test_the_job_logs_what_leaves_training(caplog) -> None:
    examples = [chat("Why is   the sky\nblue?"), chat("Other?"), chat("Why is the sky blue?")]
    with caplog.at_level(logging.INFO, "eaglenest.optimize"):
        train, held = split(examples, 1, "j")
    assert held == [examples[2]] and train == [examples[1]]
    assert "job j: 1 training samples ask a held-out benchmark question" in caplog.text


def test_nothing_left_to_train_on_is_an_input_error() -> None:
    with pytest.raises(InputError, match="EAGLENEST_HOLDOUT"):
        split([chat("Q?"), chat("Q?")], 1, "j")


def test_the_readme_data_keeps_its_held_out_questions_out_of_training() -> None:
    """The README's train.jsonl (gsm8k then ultrachat): the 8 held out are ultrachat's last
    lines, whose questions 8 multi-turn ultrachat samples ask again; those leave."""
    examples = [e for n in ("gsm8k_training.jsonl", "ultrachat_0_8k_515292.jsonl")
                for e in load_examples(builtin_path(n))]
    train, held = split(examples, 8, "readme")
    assert len(held) == 8 and len(train) == len(examples) - 8 - 8
    asked = {m["content"] for e in held for m in e.messages if m["role"] == "user"}
    assert not any(asked & {m["content"] for m in e.messages if m["role"] == "user"}
                   for e in train if isinstance(e, Chat))
