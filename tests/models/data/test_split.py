"""models/data/split.py: the held-out examples' questions are not asked in training."""

from __future__ import annotations

from eaglenest.models.data import BUILTIN_NAMES, Chat, Completion, load_examples
from eaglenest.models.data.split import (
    benchmark_question,
    held_out_indices,
    held_out_split,
    questions,
)


def chat(*asked: str) -> Chat:
    messages = []
    for q in asked:
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": "ok"}]
    return Chat(messages)


def test_a_question_asked_in_any_turn_or_as_a_prompt_leaves_training() -> None:
    examples = [chat("A?", "B?"), chat("D?"), Completion("C?", "x"), chat("C?"),
                chat("  B? ")]
    train, held, dropped = held_out_split(examples, 2)
    # held out: indices 2 and 4 (the completion C? and the chat B?); [A?, B?] asks B? in
    # its second turn, [C?] asks C? as a chat: both leave
    assert held == [Completion("C?", "x"), chat("  B? ")]
    assert train == [chat("D?")] and dropped == 2
    train, held, dropped = held_out_split([chat("A?", "B?"), chat("C?"), chat("B?")], 1)
    assert (train, held, dropped) == ([chat("C?")], [chat("B?")], 1)  # B? in a second turn


def test_whitespace_does_not_hide_a_question() -> None:
    examples = [chat("Why is   the sky\nblue?"), chat("Other?"), chat("Why is the sky blue?")]
    assert held_out_split(examples, 1) == ([examples[1]], [examples[2]], 1)


def test_held_out_examples_spread_through_the_data() -> None:
    """Several sources one after another: every part of the data is held out from, the
    last example always; the indices of the module docstring's worked examples."""
    assert held_out_indices(10, 3) == [3, 6, 9]
    assert held_out_indices(164, 8) == [20, 40, 61, 81, 102, 122, 143, 163]
    assert held_out_indices(3, 5) == [0, 1, 2] and held_out_indices(4, 0) == []
    examples = [chat(f"math {i}?") for i in range(6)] + [chat(f"chat {i}?") for i in range(6)]
    _, held, _ = held_out_split(examples, 4)
    assert held == [chat("math 2?"), chat("math 5?"), chat("chat 2?"), chat("chat 5?")]


def test_a_held_out_question_is_never_held_out_twice() -> None:
    """A pick asking an earlier pick's question moves down to the nearest new question;
    the repeat stays out of training (it asks a held-out question)."""
    examples = [chat("A?"), chat("B?"), chat("C?"), chat("D?"), chat("E?"), chat("C?")]
    train, held, dropped = held_out_split(examples, 2)  # picks 2 and 5: 5 asks C? again
    assert held == [chat("C?"), chat("E?")]
    assert train == [chat("A?"), chat("B?"), chat("D?")] and dropped == 1


def test_no_built_in_file_leaks_its_held_out_questions_into_training() -> None:
    """The benchmarks hold out 2 of every built-in file (the middle and the last);
    ultrachat's last 12 lines repeat the first questions of its first 12, so its last line's
    question is asked by a training sample, which leaves."""
    for name in BUILTIN_NAMES:
        examples = load_examples(name)
        train, held, dropped = held_out_split(examples, 2)
        assert len(held) == 2 and len(train) == len(examples) - 2 - dropped
        assert len({benchmark_question(e) for e in held}) == 2, name
        assert dropped == (1 if name.startswith("ultrachat") else 0), name
        asked = set().union(*map(questions, held))
        assert not any(questions(e) & asked for e in train), name
