"""The held-out split: the last examples are held out, and no training example asks what a
held-out one asks.

A held-out example's benchmark question is its first user turn (a chat) or its prompt (a
completion); a training example asks every user turn it holds, or its prompt. Questions
compare up to whitespace. A training example that asks a held-out question leaves
training: with regenerated answers (greedy, so the same answer to the same question) the
head would otherwise learn the held-out answers, and held-out accuracy, acceptance and
speed-up would measure recall, not prediction.

Example: chats [A?, B?], [C?], [B?] with 1 held out: held-out [B?]; [A?, B?] asks B? in
its second turn and leaves; training [C?].
"""

from __future__ import annotations

from eaglenest.models.data.readers import Chat, Example


def _asked(text: str) -> str:
    return " ".join(text.split())  # the same question whatever its whitespace


def questions(example: Example) -> set[str]:
    """What an example asks: a chat's user turns, a completion's prompt (normalised)."""
    if isinstance(example, Chat):
        return {_asked(m["content"]) for m in example.messages if m["role"] == "user"}
    return {_asked(example.prompt)}


def benchmark_question(example: Example) -> str | None:
    """What a held-out example's benchmark prompt asks: a chat's first user turn (None
    without one), a completion's prompt."""
    if isinstance(example, Chat):
        return next((_asked(m["content"]) for m in example.messages if m["role"] == "user"),
                    None)
    return _asked(example.prompt)


def held_out_split(examples: list[Example], holdout: int
                   ) -> tuple[list[Example], list[Example], int]:
    """(training, held-out, training examples dropped): the last ``holdout`` examples are
    held out; the training examples asking one of their benchmark questions are dropped."""
    cut = max(0, len(examples) - holdout)
    train, held = examples[:cut], examples[cut:]
    asked = {q for q in map(benchmark_question, held) if q}
    kept = [e for e in train if not (questions(e) & asked)]
    return kept, held, len(train) - len(kept)
