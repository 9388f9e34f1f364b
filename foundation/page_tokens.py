"""The one NextToken codec of every listing: SageMaker's List* (db/pagination.py), ListTags
(db/tags_repo.py), the Tagging API's PaginationToken (api/tagging/operations.py) and S3's
continuation tokens (api/s3/listing.py).

A token is the url-safe base64 of compact JSON `{"c": cursor, "f": fingerprint}`: the
cursor says where the next page starts (a row's sort value and id, an offset, a key), the
fingerprint names the query it belongs to, so that a token of another query is refused
instead of silently skipping items. Tokens are opaque to callers and are not promised to
stay valid from one version to the next. Each user words its own errors: `decode` only
raises `MalformedToken` (not a token of ours, or a cursor its check refuses) or
`ForeignToken` (a well-formed token of another query), in that order of checks.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from typing import Any


class MalformedToken(ValueError):
    """Not a token this codec wrote, or its cursor is not of the expected kind."""


class ForeignToken(MalformedToken):
    """A well-formed token whose fingerprint is another query's."""


def fingerprint(query: Any) -> str:
    """A short digest of everything that defines a listing (JSON of it, keys sorted)."""
    raw = json.dumps(query, sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def encode(cursor: Any, fingerprint: str = "") -> str:
    data = json.dumps({"c": cursor, "f": fingerprint}, separators=(",", ":"))
    return base64.urlsafe_b64encode(data.encode()).decode()


def decode(token: str, fingerprint: str = "",
           valid: Callable[[Any], bool] = lambda cursor: True) -> Any:
    """The cursor of `token` if `valid` accepts it and the token is `fingerprint`'s."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        cursor, token_fp = data["c"], data["f"]
    except Exception as exc:  # any garbage is the caller's error, not ours
        raise MalformedToken(token) from exc
    if not valid(cursor):
        raise MalformedToken(token)
    if token_fp != fingerprint:
        raise ForeignToken(token)
    return cursor


def is_offset(cursor: Any) -> bool:
    """An offset cursor: a non-negative int (not a bool)."""
    return isinstance(cursor, int) and not isinstance(cursor, bool) and cursor >= 0
