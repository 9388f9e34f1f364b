"""models/data/split.py: the held-out examples' questions are not asked in training."""

from __future__ import annotations

from eaglenest.models.data import BUILTIN_NAMES, Chat, Completion, load_examples
from eaglenest.models.data.split import held_out_split, questions


def chat(*asked: str) -> Chat:
    messages = []
    for q in asked:
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": "ok"}]
    return Chat(messages)


def test_a_question_asked_in_any_turn_or_as_a_prompt_leaves_training() -> None:
    examples = [chat("A?", "B?"), chat("C?"), chat("  B? "), Completion("C?", "x"),
                chat("D?")]
    train, held, dropped = held_out_split(examples, 2)
    # held out: the completion C? and the chat D?; the chat [C?] asks C? and leaves
    assert held == [Completion("C?", "x"), chat("D?")]
    assert train == [chat("A?", "B?"), chat("  B? ")] and dropped == 1
    train, held, dropped = held_out_split([chat("A?", "B?"), chat("C?"), chat("B?")], 1)
    assert (train, held, dropped) == ([chat("C?")], [chat("B?")], 1)  # B? in a second turn


def test_whitespace_does_not_hide_a_question() -> None:
    examples = [chat("Why is   the sky\nblue?"), chat("Other?"), chat("Why is the sky blue?")]
    assert held_out_split(examples, 1) == ([examples[1]], [examples[2]], 1)


def test_no_built_in_file_leaks_its_held_out_questions_into_training() -> None:
    """The benchmarks hold out the last 2 of every built-in file; ultrachat's last 12 lines
    repeat the first questions of its first 12, so 2 of its training samples leave."""
    for name in BUILTIN_NAMES:
        examples = load_examples(name)
        train, held, dropped = held_out_split(examples, 2)
        assert len(held) == 2 and len(train) == len(examples) - 2 - dropped
        assert dropped == (2 if name.startswith("ultrachat") else 0), name
        asked = set().union(*map(questions, held))
        assert not any(questions(e) & asked for e in train), name
