"""The held-out split: examples spread evenly through the data are held out, and no training
example asks what a held-out one asks.

Spread, not the last ones: data is often several sources one after another (the README's
train.jsonl is every built-in dataset), and the held-out examples are the benchmark's
prompts and the held-out accuracy's samples; they should stand for all of it, not for the
last source alone. Example i of `holdout` from `n` is index ceil((i + 1) * n / holdout) - 1,
so the last example is always held out. Worked example, n = 10, holdout = 3: (i + 1) * 10 /
3 = 3.33, 6.67, 10 -> indices 3, 6, 9; n = 164, holdout = 8 -> 20, 40, 61, 81, 102, 122,
143, 163. A pick whose benchmark question an earlier pick already asks (data repeats
questions: the built-in ultrachat's last 12 lines ask its first 12 questions again) moves
down to the nearest example not held out that asks a new one: the benchmark never runs the
same prompt twice. With the README's data, 163 asks what 143 asks and 162 is held out.

A held-out example's benchmark question is its first user turn (a chat) or its prompt (a
completion); a training example asks every user turn it holds, or its prompt. Questions
compare up to whitespace. A training example that asks a held-out question leaves
training: with regenerated answers (greedy, so the same answer to the same question) the
head would otherwise learn the held-out answers, and held-out accuracy, acceptance and
speed-up would measure recall, not prediction.

Example: chats [A?, B?], [C?], [B?] with 1 held out: held-out [B?] (the last); [A?, B?]
asks B? in its second turn and leaves; training [C?].
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


def held_out_indices(n: int, holdout: int) -> list[int]:
    """The indices of the `holdout` examples of `n` held out, ascending (module docstring);
    all of them when `holdout >= n`."""
    if holdout >= n:
        return list(range(n))
    return [-(-(i + 1) * n // holdout) - 1 for i in range(holdout)]


def _distinct_picks(examples: list[Example], indices: list[int]) -> set[int]:
    """`indices`, each moved down to the nearest example not picked yet whose benchmark
    question no earlier pick asks (dropped when there is none)."""
    picked: set[int] = set()
    asked: set[str] = set()
    for start in indices:
        for i in range(start, -1, -1):
            question = benchmark_question(examples[i])
            if i in picked or (question is not None and question in asked):
                continue
            picked.add(i)
            if question is not None:
                asked.add(question)
            break
    return picked


def held_out_split(examples: list[Example], holdout: int
                   ) -> tuple[list[Example], list[Example], int]:
    """(training, held-out, training examples dropped): ``holdout`` examples spread evenly
    through the data are held out, in data order; the training examples asking one of
    their benchmark questions are dropped."""
    picked = _distinct_picks(examples, held_out_indices(len(examples), max(0, holdout)))
    held = [e for i, e in enumerate(examples) if i in picked]
    train = [e for i, e in enumerate(examples) if i not in picked]
    asked = {q for q in map(benchmark_question, held) if q}
    kept = [e for e in train if not (questions(e) & asked)]
    return kept, held, len(train) - len(kept)
