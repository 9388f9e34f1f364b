"""foundation.page_tokens: the one NextToken codec (cursor + fingerprint, url-safe base64)."""

from __future__ import annotations

import base64

import pytest

from eaglenest.foundation import page_tokens


def test_round_trip_of_each_cursor_kind() -> None:
    for cursor in (0, 17, [1.5, 3], ["a", 9], "photos/2024/"):
        token = page_tokens.encode(cursor, "fp")
        assert page_tokens.decode(token, "fp") == cursor
        assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                 "0123456789-_=")


def test_fingerprint_is_stable_and_distinguishes_queries() -> None:
    assert page_tokens.fingerprint({"a": 1, "b": 2}) == page_tokens.fingerprint({"b": 2, "a": 1})
    assert page_tokens.fingerprint(["arn:x"]) != page_tokens.fingerprint(["arn:y"])
    assert len(page_tokens.fingerprint("x")) == 16


@pytest.mark.parametrize("token", ["", "garbage", "!!!", base64.urlsafe_b64encode(b"[1]").decode(),
                                   base64.urlsafe_b64encode(b'{"c": 1}').decode()])
def test_garbage_is_malformed(token: str) -> None:
    with pytest.raises(page_tokens.MalformedToken) as exc:
        page_tokens.decode(token, "fp")
    assert not isinstance(exc.value, page_tokens.ForeignToken)


def test_a_cursor_the_check_refuses_is_malformed_before_the_fingerprint_is_compared() -> None:
    token = page_tokens.encode(-1, "other")
    with pytest.raises(page_tokens.MalformedToken) as exc:
        page_tokens.decode(token, "fp", page_tokens.is_offset)
    assert not isinstance(exc.value, page_tokens.ForeignToken)


def test_another_querys_token_is_foreign() -> None:
    with pytest.raises(page_tokens.ForeignToken):
        page_tokens.decode(page_tokens.encode(5, "other"), "fp", page_tokens.is_offset)


def test_offsets_are_non_negative_ints_not_bools() -> None:
    assert page_tokens.is_offset(0) and page_tokens.is_offset(10)
    assert not any(page_tokens.is_offset(v) for v in (-1, True, 1.0, "1", None, [1]))
