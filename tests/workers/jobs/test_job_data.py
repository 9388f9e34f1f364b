"""The job's held-out split: no training sample asks a held-out benchmark question."""

from __future__ import annotations

import logging

import pytest

from eaglenest.models.data import Chat, Completion, builtin_path, load_examples
from eaglenest.workers.jobs.inputs import InputError
from eaglenest.workers.jobs.job_data import split


def chat(*questions: str) -> Chat:
    messages = []
    for q in questions:
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": "ok"}]
    return Chat(messages)


def test_training_samples_asking_a_held_out_question_leave_training(caplog) -> None:
    examples = [chat("A?", "B?"), chat("C?"), chat("  B? "), Completion("C?", "x"),
                chat("D?")]
    with caplog.at_level(logging.INFO, "eaglenest.optimize"):
        train, held = split(examples, 2, "j")
    # held out: the completion C? and the chat D?; the chat [C?] asks C? and leaves
    assert held == [Completion("C?", "x"), chat("D?")]
    assert train == [chat("A?", "B?"), chat("  B? ")]  # neither asks C? or D?
    assert "job j: 1 training samples ask a held-out benchmark question" in caplog.text
    train, held = split([chat("A?", "B?"), chat("C?"), chat("B?")], 1, "j")
    assert held == [chat("B?")] and train == [chat("C?")]  # B? in a second turn counts


def test_whitespace_does_not_hide_a_question(caplog) -> None:
    examples = [chat("Why is   the sky\nblue?"), chat("Other?"), chat("Why is the sky blue?")]
    with caplog.at_level(logging.INFO, "eaglenest.optimize"):
        train, held = split(examples, 1, "j")
    assert held == [examples[2]] and train == [examples[1]]
    assert "job j: 1 training samples ask a held-out benchmark question" in caplog.text


def test_nothing_left_to_train_on_is_an_input_error() -> None:
    with pytest.raises(InputError, match="EAGLENEST_HOLDOUT"):
        split([chat("Q?"), chat("Q?")], 1, "j")


def test_the_built_in_chat_file_keeps_its_held_out_questions_out_of_training() -> None:
    """ultrachat's last 12 lines repeat the first questions of its first 12 (as ShareGPT):
    the 8 held out are asked again by 8 multi-turn samples, which leave training."""
    examples = load_examples(builtin_path("ultrachat_0_8k_515292.jsonl"))
    train, held = split(examples, 8, "j")
    assert len(held) == 8 and len(train) == len(examples) - 8 - 8
    held_questions = {m["content"] for e in held for m in e.messages if m["role"] == "user"}
    for e in train:
        assert not held_questions & {m["content"] for m in e.messages if m["role"] == "user"}
