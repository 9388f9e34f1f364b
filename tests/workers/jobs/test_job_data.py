"""The job's held-out split (workers/jobs/job_data.py ``split``): the rule of
models/data/split.py, a log line for what leaves training, an InputError for nothing left."""

from __future__ import annotations

import logging

import pytest

from eaglenest.models.data import BUILTIN_NAMES, Chat, builtin_path, load_examples
from eaglenest.models.data.split import benchmark_question, questions
from eaglenest.workers.infra.model_fetch import InputError
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
    """The README's train.jsonl (every built-in file, in order): the 8 held out come from
    all five (2 gsm8k, 1 magicoder, 1 opencodeinstruct, 2 swebench, 2 ultrachat, all
    different questions); the 2 ultrachat samples that ask a held-out question again leave."""
    examples = [e for n in BUILTIN_NAMES for e in load_examples(builtin_path(n))]
    train, held = split(examples, 8, "readme")
    assert len(held) == 8 and len(train) == len(examples) - 8 - 2
    asked = [benchmark_question(e) for e in held]
    assert len(set(asked)) == 8
    assert not any(set(asked) & questions(e) for e in train)
