"""The console's session cookie and sign-in limiter (api/console/session.py) on their own:
what a browser test cannot reach in a minute (expiry, the window sliding, the bound on
what the limiter remembers, the per-key count apart from the per-address one)."""

from __future__ import annotations

from eaglenest.api.console import session
from eaglenest.foundation.settings import AccessKey

KEY = AccessKey("AKIAEXAMPLE000000001", "secret-one", "111111111111", "one")
OTHER = AccessKey("AKIAEXAMPLE000000002", "secret-two", "222222222222", "two")
KEYS = {KEY.access_key_id: KEY, OTHER.access_key_id: OTHER}


def test_a_session_lasts_its_lifetime_and_names_its_account() -> None:
    cookie, expires = session.issue(KEY, 3600, now=1000.0)
    assert expires == 4600.0
    viewer = session.verify(cookie, KEYS, "us-east-1", now=4599.0)
    assert viewer is not None and viewer.account.account_id == "111111111111"
    assert viewer.key_id == KEY.access_key_id
    assert session.verify(cookie, KEYS, "us-east-1", now=4600.0) is None  # expired
    # a cookie of one key does not pass for another, nor with its secret changed
    key_part, rest = cookie.split(".", 1)
    other_part = session.issue(OTHER, 3600, now=1000.0)[0].split(".", 1)[0]
    assert session.verify(f"{other_part}.{rest}", KEYS, "us-east-1", now=2000.0) is None
    changed = {KEY.access_key_id: AccessKey(KEY.access_key_id, "rotated", "111111111111", "one")}
    assert session.verify(cookie, changed, "us-east-1", now=2000.0) is None
    for bad in ("", "a.b.c", "!!!.1.2.3", cookie + "0", "x" * 600):
        assert session.verify(bad, KEYS, "us-east-1", now=2000.0) is None


def test_csrf_tokens_differ_per_session_and_check_in_constant_time() -> None:
    a = session.verify(session.issue(KEY, 60, now=0)[0], KEYS, "r", now=1)
    b = session.verify(session.issue(KEY, 60, now=0)[0], KEYS, "r", now=1)
    assert a is not None and b is not None and a.csrf != b.csrf
    assert session.csrf_ok(a.csrf, a.csrf)
    assert not session.csrf_ok(a.csrf, b.csrf)
    assert not session.csrf_ok(a.csrf, None) and not session.csrf_ok(a.csrf, "")


def test_the_limiter_counts_per_address_and_per_key_over_a_sliding_minute() -> None:
    limiter = session.AttemptLimiter(per_minute=3)
    for t in (0.0, 1.0, 2.0):
        assert limiter.attempt(["address 10.0.0.1", "key A"], now=t) is None
    assert limiter.attempt(["address 10.0.0.1", "key B"], now=3.0) == 57.0  # address full
    assert limiter.attempt(["address 10.0.0.2", "key A"], now=3.0) == 57.0  # key A full
    assert limiter.attempt(["address 10.0.0.2", "key B"], now=3.0) is None
    assert limiter.attempt(["address 10.0.0.1", "key C"], now=60.5) is None  # t=0 expired


def test_the_limiter_remembers_a_bounded_number_of_subjects() -> None:
    limiter = session.AttemptLimiter(per_minute=1, max_tracked=100)
    for i in range(1000):
        limiter.attempt([f"address 10.0.{i // 256}.{i % 256}"], now=1.0)
    assert len(limiter) == 100
    # the least recently seen were forgotten; the latest are still counted
    assert limiter.attempt(["address 10.0.3.231"], now=2.0) is not None
    assert limiter.attempt(["address 10.0.0.0"], now=2.0) is None
