from __future__ import annotations

import pytest

from eaglenest.models.data import Chat, Completion, DataError, encode_example, encode_examples
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
    a = regenerate([chat, Completion("def f", "old")], llama, max_new_tokens=5)
    b = regenerate([chat, Completion("def f", "old")], llama, max_new_tokens=5)
    assert a == b
    assert all(m["content"] != "old" for m in a[0].messages if m["role"] == "assistant") or not a


def test_regenerate_batched_equals_one_at_a_time(llama) -> None:  # noqa: ANN001
    """Left-padded batches give each example the text it gets alone (greedy); turn 2 of a
    two-turn chat is generated after, and conditioned on, the rewritten turn 1."""
    examples = [
        Chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"},
              {"role": "user", "content": "and then a longer second question"},
              {"role": "assistant", "content": "old"}]),
        Completion("def f", "old"),
        Completion("a much longer completion prompt with many more tokens", "old"),
        Chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"},
              {"role": "assistant", "content": "old"}]),
    ]
    alone = [regenerate([e], llama, max_new_tokens=6, keep_empty=True)[0] for e in examples]
    seen: list[tuple[int, int]] = []
    batched = regenerate(examples, llama, max_new_tokens=6, batch_size=3, keep_empty=True,
                         progress=lambda done, total: seen.append((done, total)))
    assert batched == alone
    # turn 1 of all four (a batch of 3, then 1), then the chat's turn 2
    assert seen == [(3, 5), (4, 5), (5, 5)]
    first = batched[0]
    assert isinstance(first, Chat) and [m["role"] for m in first.messages] == [
        "user", "assistant", "user", "assistant"]
    assert first.messages[1]["content"] != "old" and first.messages[3]["content"] != "old"
