from __future__ import annotations

import pytest

from eaglenest.models.data import (
    Chat,
    Completion,
    DataError,
    Example,
    encode_example,
    encode_examples,
)
from eaglenest.models.data.regenerate import regenerate
from eaglenest.models.data.template import assistant_spans


def test_assistant_only_mask_chatml(llama) -> None:  # noqa: ANN001
    tok = llama.tokenizer
    chat = Chat(
        [
            {"role": "user", "content": "add two"},
            {"role": "assistant", "content": "def add"},
            {"role": "user", "content": "more"},
            {"role": "assistant", "content": "return a"},
        ]
    )
    text, spans = assistant_spans(chat.messages, tok)
    assert [text[s:e] for s, e in spans] == ["def add<|im_end|>\n", "return a<|im_end|>\n"]
    sample = encode_example(chat, tok)
    trained = tok.decode([t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m])
    assert trained == "def add<|im_end|>\nreturn a<|im_end|>\n"
    assert sample.input_ids == tok.apply_chat_template(chat.messages, return_dict=False)


def test_completion_mask_adds_eos(llama) -> None:  # noqa: ANN001
    tok = llama.tokenizer
    s = encode_example(Completion("Q: 2+2\nA:", " 4"), tok)
    assert s.input_ids[-1] == tok.eos_token_id and s.loss_mask[-1] == 1
    assert (
        tok.decode([t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m])
        == " 4<|im_end|>"
    )


def test_truncation_and_no_usable_sample(llama) -> None:  # noqa: ANN001
    chat = Chat([{"role": "user", "content": "x" * 200}, {"role": "assistant", "content": "y"}])
    with pytest.raises(DataError, match="no usable sample"):
        encode_examples([chat], llama.tokenizer, max_length=16)


def test_regenerate_is_greedy_and_deterministic(llama) -> None:  # noqa: ANN001
    chat = Chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"}])
    a = regenerate([chat, Completion("def f", "old")], llama, max_new_tokens=5, keep_empty=True)
    b = regenerate([chat, Completion("def f", "old")], llama, max_new_tokens=5, keep_empty=True)
    assert a == b
    assert isinstance(a[0], Chat) and a[0].messages[1]["content"] != "old"
    assert isinstance(a[1], Completion) and a[1].completion != "old"


EXAMPLES: list[Example] = [
    Chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"},
          {"role": "user", "content": "and then a longer second question"},
          {"role": "assistant", "content": "old"}]),
    Completion("def f", "old"),
    Completion("a much longer completion prompt with many more tokens", "old"),
    Chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"},
          {"role": "assistant", "content": "old"}]),
]


def test_regenerate_batched_equals_one_at_a_time(llama) -> None:  # noqa: ANN001
    """Continuous batching gives each example the text it gets alone (greedy); turn 2 of a
    two-turn chat is generated after, and conditioned on, the rewritten turn 1; progress
    counts every turn as it finishes."""
    alone = [regenerate([e], llama, max_new_tokens=6, keep_empty=True)[0] for e in EXAMPLES]
    seen: list[tuple[int, int]] = []
    batched = regenerate(EXAMPLES, llama, max_new_tokens=6, batch_size=3, keep_empty=True,
                         progress=lambda done, total: seen.append((done, total)))
    assert batched == alone
    assert seen == [(n, 5) for n in range(1, 6)]
    first = batched[0]
    assert isinstance(first, Chat) and [m["role"] for m in first.messages] == [
        "user", "assistant", "user", "assistant"]
    assert first.messages[1]["content"] != "old" and first.messages[3]["content"] != "old"
    # a token budget below one turn's prompt + answer still runs them, one at a time
    assert regenerate(EXAMPLES, llama, max_new_tokens=6, max_batch_tokens=1,
                      keep_empty=True) == alone


def test_regenerate_sampled_follows_seed_not_batching(llama) -> None:  # noqa: ANN001
    """Sampled turns draw from a generator per (example, turn): the batch size does not
    change them; another seed does."""
    def run(batch_size: int, seed: int) -> list[Example]:
        return regenerate(EXAMPLES, llama, max_new_tokens=8, temperature=1.0, seed=seed,
                          batch_size=batch_size, keep_empty=True)

    one = run(1, 7)
    assert run(4, 7) == one
    assert run(4, 8) != one


def test_regenerate_recurrent_target_uses_generate(tiny_target) -> None:  # noqa: ANN001
    """A target with linear-attention layers (no batched KV cache) regenerates through
    left-padded `generate` batches: every turn is rewritten and the batching is invisible."""
    target = tiny_target("Qwen3NextForCausalLM")
    alone = [regenerate([e], target, max_new_tokens=4, keep_empty=True)[0] for e in EXAMPLES]
    assert regenerate(EXAMPLES, target, max_new_tokens=4, batch_size=2,
                      keep_empty=True) == alone
