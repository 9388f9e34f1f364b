"""Keyset pagination done in the database.

A NextToken (foundation/page_tokens.py) holds the last row's sort value and id and the
fingerprint of the query (sort key, order and filters), so a token from a different query is
rejected instead of silently skipping rows. Page n+1 starts strictly after (value, id) in the
sort order, which stays correct while rows are inserted and costs one index range scan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, tuple_
from sqlalchemy.orm import InstrumentedAttribute, Session

from eaglenest.foundation import page_tokens
from eaglenest.foundation.errors import ValidationException


@dataclass(frozen=True)
class PageRequest:
    sort_column: InstrumentedAttribute[Any]
    id_column: InstrumentedAttribute[Any]
    descending: bool
    max_results: int
    next_token: str | None
    fingerprint: str


def fingerprint(**query: Any) -> str:
    return page_tokens.fingerprint(query)


_MAX_ID = 2**63 - 1  # what a database integer key holds


def _well_typed(cursor: Any, kind: type) -> bool:
    """A token's cursor must be what `paginate` wrote: [sort value, id] of the column's type.

    Tokens are only base64 JSON, so a caller can forge one with the right fingerprint; a
    list, a huge int or a string where a number belongs must not reach the database.
    """
    if not isinstance(cursor, list) or len(cursor) != 2:
        return False
    value, row_id = cursor
    if not isinstance(row_id, int) or isinstance(row_id, bool) or abs(row_id) > _MAX_ID:
        return False
    if kind is str:
        return isinstance(value, str) and "\x00" not in value
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _MAX_ID


def _decode(token: str, fp: str, kind: type) -> tuple[Any, int]:
    try:
        value, row_id = page_tokens.decode(token, fp, lambda c: _well_typed(c, kind))
    except page_tokens.ForeignToken:
        raise ValidationException(
            "Invalid pagination token: NextToken does not belong to this query "
            "(sort order or filters changed)."
        ) from None
    except page_tokens.MalformedToken:
        raise ValidationException("Invalid pagination token: NextToken is malformed.") from None
    return value, row_id


def paginate(
    session: Session, stmt: Select[Any], page: PageRequest
) -> tuple[list[Any], str | None]:
    """Run `stmt` (already filtered) one page at a time; return (rows, next_token)."""
    col, idc = page.sort_column, page.id_column
    if page.next_token:
        value, row_id = _decode(page.next_token, page.fingerprint, col.type.python_type)
        # Row-value comparison, so the database seeks the (col, id) index straight to the
        # cursor; the equivalent OR form makes SQLite scan from the start of the index.
        key, cursor = tuple_(col, idc), tuple_(value, row_id)
        stmt = stmt.where(key < cursor if page.descending else key > cursor)
    order = (col.desc(), idc.desc()) if page.descending else (col.asc(), idc.asc())
    rows = list(session.scalars(stmt.order_by(*order).limit(page.max_results + 1)))
    if len(rows) <= page.max_results:
        return rows, None
    rows = rows[: page.max_results]
    last = rows[-1]
    return rows, page_tokens.encode([getattr(last, col.key), last.id], page.fingerprint)
