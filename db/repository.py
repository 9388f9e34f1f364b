"""Helpers shared by the per-resource repositories."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Select, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from eaglenest.db import bucket_claims
from eaglenest.db.pagination import PageRequest, fingerprint, paginate
from eaglenest.db.tables import Base
from eaglenest.foundation.accounts import Account, ResourceRef
from eaglenest.foundation.errors import ValidationException
from eaglenest.foundation.failure_reason import one_line
from eaglenest.foundation.store.storage import (
    BucketStore,
    StorageError,
    check_characters,
    check_segments,
)

RowT = TypeVar("RowT", bound=Base)


log = logging.getLogger("eaglenest.failure")


def failure_reason(reason: str | None, arn: str) -> str | None:
    """`reason` as the resource `arn` stores and describes it: one line, its cause, nothing
    of the host or of another account (foundation/failure_reason.py), applied here, where
    every status is set, never by the callers. The reason in full goes to the log of the
    process that sets it (the worker's) when that is not what is stored."""
    if reason is None:
        return None
    ref = ResourceRef.parse(arn)
    stored = one_line(reason, ref.account_id if ref else None)
    if stored != reason:
        log.warning("%s: FailureReason %r; in full: %s", arn, stored, reason)
    return stored


def now() -> float:
    return time.time()


def insert_unique(session: Session, row: Base, duplicate: Exception) -> None:
    """Insert `row`; if its unique name is taken, raise `duplicate` (nothing is written)."""
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError as exc:
        raise duplicate from exc


def new_row(table: type[RowT], account: Account, kind: str, name: str, spec: dict[str, Any],
            tags: list[Any], *, modified: bool = False, **columns: Any) -> RowT:
    """A new resource's row: its name and the case-folded key names are unique by, its ARN
    (`kind`: the ARN's resource type), account, creation time (and last-modified time, the
    same, when `modified`), request and stored tags; `columns` are the table's own."""
    t = now()
    if modified:
        columns["last_modified_time"] = t
    return table(name=name, name_key=name.lower(), arn=account.arn(kind, name),
                 account_id=account.account_id, creation_time=t, spec=spec, tags=tags,
                 **columns)


def checked_claims(store: BucketStore | None, account: Account,
                   spec: dict[str, Any]) -> list[bucket_claims.Reference]:
    """The S3 URIs of a Create request checked (the store would refuse them later: refuse
    them now) and, with `store`, the buckets it names that the account may use."""
    check_s3_uris(spec)
    return bucket_claims.check(store, account, spec) if store else []


def insert_claiming(session: Session, row: RowT, duplicate: Exception, account: Account,
                    store: BucketStore | None, refs: list[bucket_claims.Reference]) -> RowT:
    """Insert a new resource's `row` (`duplicate` if its name is taken), then, with `store`,
    claim the buckets its request names (`refs`, from bucket_claims.check before anything
    was written)."""
    insert_unique(session, row, duplicate)
    if store:
        bucket_claims.claim(store, account, row.spec, refs)  # type: ignore[attr-defined]
    return row


def check_s3_uris(spec: Any, at: str = "") -> None:
    """A ValidationException naming the member of the first `s3://` URI in a request that
    holds a control character or an empty key segment (`s3://b//k`, `s3://b/a//k`): the
    artifact store refuses those keys, so they are refused before anything is written."""
    if isinstance(spec, dict):
        for k, v in spec.items():
            check_s3_uris(v, f"{at}.{k}" if at else k)
    elif isinstance(spec, list):
        for i, v in enumerate(spec, start=1):
            check_s3_uris(v, f"{at}.{i}")
    elif isinstance(spec, str) and spec.startswith("s3://"):
        try:
            check_characters(spec)
            check_segments(spec)
        except StorageError as exc:
            raise ValidationException(f"{at}: {exc}") from None


def find(session: Session, table: type[RowT], name: str, *, account_id: str,
         lock: bool = False) -> RowT | None:
    """`account_id`'s row named `name` (ignoring case). The API passes the caller's account
    (another account's resource is not found); a worker, the account of the row it works on."""
    t: Any = table
    stmt = select(table).where(t.account_id == account_id, t.name_key == name.lower())
    if lock:
        stmt = stmt.with_for_update()
    return session.scalars(stmt).first()


def get_named(session: Session, table: type[RowT], account: Account, name: str,
              not_found: Callable[[Account, str], Exception], *, lock: bool = False) -> RowT:
    """`account`'s row named `name` (see `find`); raises `not_found(account, name)` if none."""
    row = find(session, table, name, lock=lock, account_id=account.account_id)
    if row is None:
        raise not_found(account, name)
    return row


def locate(session: Session, table: type[RowT], ref: str, *, lock: bool = False
           ) -> RowT | None:
    """The row a worker task names: `ref` is the row's ARN (which holds the account). A bare
    name (a task queued before names were per account) is accepted only while exactly one
    row of any account has it; otherwise None, as for a row that is gone."""
    t: Any = table
    if ResourceRef.parse(ref) is not None:
        stmt = select(table).where(t.arn == ref)
    else:
        stmt = select(table).where(t.name_key == ref.lower()).limit(2)
    if lock:
        stmt = stmt.with_for_update()
    rows = session.scalars(stmt).all()
    return rows[0] if len(rows) == 1 else None


def resolve(session: Session, table: type[Any], ref: str) -> ResourceRef | None:
    """What a task's argument names (see `locate`), by ARN; None when no single row."""
    row = locate(session, table, ref)
    return ResourceRef.parse(row.arn) if row is not None else None


def heartbeat(session: Session, table: type[Any], ref: str, owner: str) -> str | None:
    """Refresh `owner`'s lease on the row `ref` names (a table with owner, heartbeat_time
    and status: jobs, endpoints); the row's status, or None when gone or no longer ours."""
    row = locate(session, table, ref, lock=True)
    if row is None or row.owner != owner:
        return None
    row.heartbeat_time = now()
    return str(row.status)


@dataclass(frozen=True)
class ListQuery:
    """The filters and ordering every List* operation shares (botocore member names)."""

    sort_by: str = "CreationTime"
    descending: bool = True
    max_results: int = 10
    next_token: str | None = None
    name_contains: str | None = None
    creation_after: datetime | None = None
    creation_before: datetime | None = None
    modified_after: datetime | None = None
    modified_before: datetime | None = None
    status_equals: str | None = None


_SORT_COLUMNS = {"Name": "name_key", "CreationTime": "creation_time", "Status": "status"}


def list_rows(
    session: Session, table: type[RowT], q: ListQuery, account_id: str,
    contains_type: str | None = None
) -> tuple[list[RowT], str | None]:
    """One page of `account_id`'s rows of `table` matching `q`."""
    t: Any = table
    stmt: Select[Any] = select(table).where(t.account_id == account_id)
    if contains_type:  # optimization jobs: OptimizationContains filters the type list
        stmt = stmt.where(t.optimization_types.contains(contains_type, autoescape=True))
    if q.name_contains:
        stmt = stmt.where(t.name_key.contains(q.name_contains.lower(), autoescape=True))
    if q.creation_after:
        stmt = stmt.where(t.creation_time > q.creation_after.timestamp())
    if q.creation_before:
        stmt = stmt.where(t.creation_time < q.creation_before.timestamp())
    if q.modified_after:
        stmt = stmt.where(t.last_modified_time > q.modified_after.timestamp())
    if q.modified_before:
        stmt = stmt.where(t.last_modified_time < q.modified_before.timestamp())
    if q.status_equals:
        stmt = stmt.where(t.status == q.status_equals)
    fp = fingerprint(
        table=table.__tablename__, sort=q.sort_by, desc=q.descending, name=q.name_contains,
        ca=q.creation_after, cb=q.creation_before, ma=q.modified_after,
        mb=q.modified_before, st=q.status_equals, ty=contains_type, acct=account_id,
    )
    page = PageRequest(
        sort_column=getattr(t, _SORT_COLUMNS[q.sort_by]), id_column=t.id,
        descending=q.descending, max_results=q.max_results, next_token=q.next_token,
        fingerprint=fp,
    )
    return paginate(session, stmt, page)
