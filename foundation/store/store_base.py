"""What every artifact store shares: `s3://bucket/key` URIs and their checks, the store's
errors, an object's description, and the interfaces (`ArtifactStore`, `BucketStore`) the
local store (foundation/store/local_store.py) and S3 (foundation/store/s3_store.py) implement.
foundation/store/storage.py re-exports all of it and builds a store (`make_store`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

#: the key prefix that holds a bucket's owner record in S3; no URI may name it
RESERVED_PREFIX = ".eaglenest/"
OWNER_KEY = RESERVED_PREFIX + "owner"
BUCKET_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(?P<key>.*))?$")


class StorageError(Exception):
    """A user-actionable storage failure (bad URI, missing object)."""


class BucketNotEmpty(StorageError):
    """A bucket to delete still holds objects."""


class NoSuchBucket(StorageError):
    """The bucket is not there (deleted while a write was on its way, say)."""

    def __init__(self, bucket: str) -> None:
        super().__init__(f"s3://{bucket}/ does not exist")
        self.bucket = bucket


class OwnerChanged(StorageError):
    """A write checked for one account finds, as it commits, that the bucket is no longer
    that account's (deleted and re-created by another, or assigned by an operator)."""

    def __init__(self, bucket: str, account_id: str) -> None:
        super().__init__(f"bucket '{bucket}' is no longer owned by {account_id}")
        self.bucket, self.account_id = bucket, account_id


class KeyTooLong(StorageError):
    """A key the store cannot hold: longer than S3's 1024 bytes, or (the local store) with a
    segment longer than a file name may be."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object: its key, size in bytes, last modification (POSIX seconds) and an opaque
    entity tag (S3's ETag, quotes included; the local store derives it from size and
    modification time: it changes when the object is rewritten, it is not an MD5)."""

    key: str
    size: int
    mtime: float
    etag: str


@dataclass(frozen=True)
class S3Uri:
    bucket: str
    key: str  # no leading slash; may be "" (the bucket) or end with "/" (a prefix)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def child(self, relative: str) -> S3Uri:
        base = self.key if not self.key or self.key.endswith("/") else self.key + "/"
        return parse_uri(f"s3://{self.bucket}/{base}{relative}")


def parse_uri(uri: str) -> S3Uri:
    """Parse and check an S3 URI; reject keys that would escape their bucket.

    >>> parse_uri("s3://bucket/a/b.txt")
    S3Uri(bucket='bucket', key='a/b.txt')
    """
    m = BUCKET_URI.match(uri)
    if m is None:
        raise StorageError(f"'{uri}' is not an S3 URI of the form s3://bucket/key")
    key = m["key"] or ""
    check_characters(uri)
    check_segments(uri)
    if "\\" in key or any(p in ("..", ".") for p in key.split("/")):
        raise StorageError(f"'{uri}': keys may not contain '.', '..', '\\' or a leading '/'")
    if key == RESERVED_PREFIX.rstrip("/") or key.startswith(RESERVED_PREFIX):
        raise StorageError(f"'{uri}': keys under {RESERVED_PREFIX} are reserved for the store")
    return S3Uri(m["bucket"], key)


def check_characters(uri: str) -> None:
    """StorageError for a URI with a control character (NUL included): no key may hold one."""
    control = next((c for c in uri if ord(c) < 32 or ord(c) == 127), None)
    if control is not None:
        raise StorageError(f"{ascii(uri)}: keys may not contain control characters "
                           f"(found {ascii(control)})")


def check_segments(uri: str) -> None:
    """StorageError naming `uri` when its key has an empty segment: a leading '/' or a '//'
    (`s3://b//k`, `s3://b/a//k`). S3 keeps such keys as written while a path built from one
    collapses or restarts them (`dest / "/k"` is `/k`), so no URI may hold one."""
    if "//" in uri.removeprefix("s3://"):
        raise StorageError(f"'{uri}': keys may not contain empty segments ('//') or a "
                           "leading '/'")


class ArtifactStore(Protocol):
    def put_bytes(self, uri: S3Uri, data: bytes) -> None: ...
    def get_bytes(self, uri: S3Uri) -> bytes: ...
    def list_keys(self, prefix: S3Uri) -> list[str]: ...
    def put_file(self, uri: S3Uri, path: Path) -> None: ...
    def get_file(self, uri: S3Uri, path: Path) -> None: ...
    def delete(self, uri: S3Uri) -> None: ...


class BucketStore(ArtifactStore, Protocol):
    """A whole store (LocalStore, S3Store): objects plus the owner of each bucket."""

    #: the operator's default account, the only one that may read a bucket no account owns
    #: (None: no account may; `make_store` sets Settings.account_id)
    default_account: str | None

    def owner(self, bucket: str) -> str | None:
        """The account that owns `bucket`, or None while no account does."""
        ...

    def claim(self, bucket: str, account_id: str) -> str:
        """Make `account_id` the owner of `bucket` unless an account already is (atomic:
        of concurrent claims exactly one wins); the owner after the call."""
        ...

    def assign(self, bucket: str, account_id: str) -> None:
        """The operator's: make `account_id` the owner of `bucket`, replacing any owner."""
        ...

    def release(self, bucket: str) -> None:
        """The operator's: leave `bucket` with no owner (no error if it has none)."""
        ...

    # -- what the S3-compatible API (api/s3) needs besides the calls above --
    def stat(self, uri: S3Uri) -> ObjectInfo | None:
        """The object at `uri`, or None when there is none."""
        ...

    def list_objects(self, prefix: S3Uri) -> list[ObjectInfo]:
        """The objects whose keys start with `prefix.key`, sorted by key."""
        ...

    def open_object(self, uri: S3Uri, start: int = 0, end: int | None = None) -> BinaryIO:
        """A reader of bytes `start`..`end` (inclusive; None: to the end) of the object;
        StorageError when it does not exist. The caller closes it."""
        ...

    def adopt_file(self, uri: S3Uri, path: Path, owner: str | None = None) -> None:
        """Store the file `path` as the object `uri` (whole, at once) and remove `path`.
        With `owner`: only while the bucket is that account's, checked as the object is
        written (OwnerChanged otherwise, NoSuchBucket when it is gone; `path` is kept)."""
        ...

    def buckets(self) -> dict[str, float]:
        """Every bucket (the ones with an owner record included) -> its creation time."""
        ...

    def buckets_of(self, account_id: str) -> dict[str, float]:
        """The buckets `account_id` owns -> creation time, without reading every bucket's
        owner record (the local store keeps an index per account)."""
        ...

    def bucket_exists(self, bucket: str) -> bool: ...

    def create_bucket(self, bucket: str) -> None:
        """Make `bucket` exist (no error if it does); ownership is `claim`'s."""
        ...

    def delete_bucket(self, bucket: str) -> None:
        """Remove an empty bucket and its owner record; BucketNotEmpty if it holds objects."""
        ...


def check_bucket(bucket: str) -> str:
    """`bucket` if it is a valid bucket name, else StorageError naming it."""
    if BUCKET_URI.match(f"s3://{bucket}") is None:
        raise StorageError(f"'{bucket}' is not a bucket name")
    return bucket


