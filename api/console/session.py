"""The console's sign-in session, its CSRF tokens and the sign-in rate limit.

A session needs no table and works across API processes and hosts that share the keys
file: the cookie holds the access key id, the session's expiry (epoch seconds), a random
nonce and an HMAC-SHA256 of those three under that key's secret access key. A session is
valid while the key is in the keyring with the same secret and the expiry is ahead, so
revoking the key (`eaglenest keys revoke`) or changing its secret ends every session
signed with it.

Every form of a signed-in page carries the CSRF token HMAC(secret, "csrf" + nonce), checked
on every POST (`csrf_ok`); the sign-in form, before any session, carries the value of a
random pre-session cookie instead (double submit). Both cookies are HttpOnly,
SameSite=Strict, Path=/console, and Secure when the request came over https.

`AttemptLimiter` counts sign-in attempts per client address and per access key id over
the last minute, in this process's memory, tracking at most `max_tracked` of them (the
least recently seen is forgotten first): with several API processes each keeps its own.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass

from eaglenest.foundation.accounts import Account
from eaglenest.foundation.settings import AccessKey

SESSION_COOKIE = "eaglenest_console"
LOGIN_COOKIE = "eaglenest_console_login"
COOKIE_PATH = "/console"
#: how long the sign-in form's pre-session cookie lives (seconds)
LOGIN_COOKIE_SECONDS = 900
_MAX_KEY_ID = 128
_WINDOW = 60.0


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, *parts: str) -> str:
    msg = "|".join(parts).encode()
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Viewer:
    """Who a signed-in request is: the key, the account it acts for, its session's CSRF
    token and expiry."""

    key_id: str
    account: Account
    csrf: str
    expires: float


def issue(key: AccessKey, lifetime: int, now: float | None = None) -> tuple[str, float]:
    """A new session cookie value for `key` and its expiry."""
    expires = int((now if now is not None else time.time()) + lifetime)
    nonce = secrets.token_urlsafe(18)
    key_part = _b64(key.access_key_id.encode())
    mac = _mac(key.secret, "session", key.access_key_id, str(expires), nonce)
    return f"{key_part}.{expires}.{nonce}.{mac}", float(expires)


def verify(cookie: str | None, keys: Mapping[str, AccessKey], region: str,
           now: float | None = None) -> Viewer | None:
    """The viewer a session cookie stands for; None when it is absent, malformed, forged,
    expired, or its key is no longer in the keyring."""
    if not cookie or len(cookie) > 512:
        return None
    parts = cookie.split(".")
    if len(parts) != 4:
        return None
    key_part, expires_text, nonce, mac = parts
    try:
        key_id = _unb64(key_part).decode()
        expires = int(expires_text)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    key = keys.get(key_id)
    if key is None:
        return None
    want = _mac(key.secret, "session", key_id, str(expires), nonce)
    if not hmac.compare_digest(want, mac):
        return None
    if expires <= (now if now is not None else time.time()):
        return None
    return Viewer(key_id, Account(region, key.account_id),
                  _mac(key.secret, "csrf", nonce), float(expires))


def check_secret(keys: Mapping[str, AccessKey], key_id: str, secret: str) -> AccessKey | None:
    """The key when `secret` is its secret access key (compared in constant time)."""
    key = keys.get(key_id) if 0 < len(key_id) <= _MAX_KEY_ID else None
    if key is None:
        hmac.compare_digest(secret.encode(), b"x" * 40)  # about the same time either way
        return None
    return key if hmac.compare_digest(secret.encode(), key.secret.encode()) else None


def csrf_ok(expected: str, sent: str | None) -> bool:
    return bool(sent) and hmac.compare_digest(expected.encode(), (sent or "").encode())


def new_login_token() -> str:
    return secrets.token_urlsafe(24)


def cookie_header(name: str, value: str, max_age: int, secure: bool) -> tuple[bytes, bytes]:
    """A Set-Cookie header of the console's (max_age 0: delete it)."""
    attrs = [f"{name}={value}", f"Path={COOKIE_PATH}", f"Max-Age={max_age}", "HttpOnly",
             "SameSite=Strict"]
    if secure:
        attrs.append("Secure")
    return b"set-cookie", "; ".join(attrs).encode("latin-1")


class AttemptLimiter:
    """At most `per_minute` sign-in attempts in any 60 s per client address and per access
    key id (module docstring); thread-safe and bounded."""

    def __init__(self, per_minute: int, max_tracked: int = 10_000) -> None:
        self.per_minute, self.max_tracked = per_minute, max_tracked
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def attempt(self, subjects: list[str], now: float | None = None) -> float | None:
        """Count an attempt for each subject; None if allowed, else the seconds until the
        first subject over its limit may try again (nothing is counted then)."""
        t = time.monotonic() if now is None else now
        with self._lock:
            windows = [self._window(s, t) for s in subjects]
            full = [w for w in windows if len(w) >= self.per_minute]
            if full:
                return max(w[0] + _WINDOW - t for w in full)
            for w in windows:
                w.append(t)
            return None

    def _window(self, subject: str, t: float) -> deque[float]:
        window = self._seen.pop(subject, None) or deque()
        while window and window[0] <= t - _WINDOW:
            window.popleft()
        self._seen[subject] = window  # the most recently seen last
        while len(self._seen) > self.max_tracked:
            self._seen.popitem(last=False)
        return window

    def __len__(self) -> int:
        return len(self._seen)
