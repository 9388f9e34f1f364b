"""Buckets belong to accounts: the view of the artifact store one account's accesses go
through (jobs, endpoints, Data Capture, `eaglenest s3`), and the error it raises.

The owner records themselves live in the store (`BucketStore.owner` / `claim`,
foundation/store/storage.py), so the rule holds for the local store and for S3 alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from eaglenest.foundation.store.storage import (
    BucketNotEmpty,
    BucketStore,
    ObjectInfo,
    OwnerChanged,
    S3Uri,
    StorageError,
)


def unowned_reason(bucket: str, account_id: str) -> str:
    """Why `account_id` may not read `bucket`, which no account owns, and the way out."""
    return (f"the bucket '{bucket}' has no owner, and only the operator's default account "
            f"may read a bucket no account owns; an operator assigns it with `eaglenest s3 "
            f"owner s3://{bucket} --account {account_id}`")


class AccessDenied(StorageError):
    """An access for one account to a bucket another account owns, or a read of a bucket no
    account owns by an account other than the store's default one (`unowned`)."""

    def __init__(self, uri: str, bucket: str, account_id: str, unowned: bool = False) -> None:
        why = (unowned_reason(bucket, account_id) if unowned
               else f"bucket '{bucket}' belongs to another account than {account_id}")
        super().__init__(f"AccessDenied: {uri}: {why}")
        self.uri, self.bucket, self.account_id = uri, bucket, account_id
        self.unowned = unowned


class BucketTaken(StorageError):
    """CreateBucket of a bucket that already has an owner: this account (`mine`) or
    another."""

    def __init__(self, bucket: str, mine: bool) -> None:
        whose = "you already own it" if mine else "another account owns it"
        super().__init__(f"bucket '{bucket}' exists: {whose}")
        self.bucket, self.mine = bucket, mine


class TooManyBuckets(StorageError):
    """CreateBucket by an account that already owns its limit (EAGLENEST_MAX_BUCKETS)."""

    def __init__(self, bucket: str, limit: int) -> None:
        super().__init__(f"You have attempted to create more buckets than allowed: an "
                         f"account owns at most {limit} (EAGLENEST_MAX_BUCKETS); delete one "
                         f"it no longer needs before creating '{bucket}'")
        self.bucket, self.limit = bucket, limit


class AccountStore:
    """`store` as one account may use it: any read, list, write or delete in a bucket
    another account owns raises AccessDenied (naming the URI); a write or delete in a bucket
    no account owns claims it for this account first (the first writer owns a bucket); a
    read of one is allowed only to the store's default account (`store.default_account`,
    the operator's) and claims nothing. A bucket found to be this account's is not asked
    again for the life of the view (make one per job run, deployment or upload), except by
    `adopt_file`, which the store checks again as it writes (the S3 API's writes: a body
    may take long to arrive, and its bucket change hands meanwhile)."""

    def __init__(self, store: BucketStore, account_id: str) -> None:
        self.store, self.account_id = store, account_id
        self._mine: set[str] = set()

    def _allow(self, uri: S3Uri, write: bool) -> None:
        if uri.bucket in self._mine:
            return
        owner = self.store.owner(uri.bucket)
        if owner is None and write:
            owner = self.store.claim(uri.bucket, self.account_id)
        if owner is None:
            if self.account_id != self.store.default_account:
                raise AccessDenied(str(uri), uri.bucket, self.account_id, unowned=True)
            return
        if owner != self.account_id:
            raise AccessDenied(str(uri), uri.bucket, self.account_id)
        self._mine.add(uri.bucket)

    def put_bytes(self, uri: S3Uri, data: bytes) -> None:
        self._allow(uri, write=True)
        self.store.put_bytes(uri, data)

    def get_bytes(self, uri: S3Uri) -> bytes:
        self._allow(uri, write=False)
        return self.store.get_bytes(uri)

    def list_keys(self, prefix: S3Uri) -> list[str]:
        self._allow(prefix, write=False)
        return self.store.list_keys(prefix)

    def put_file(self, uri: S3Uri, path: Path) -> None:
        self._allow(uri, write=True)
        self.store.put_file(uri, path)

    def get_file(self, uri: S3Uri, path: Path) -> None:
        self._allow(uri, write=False)
        self.store.get_file(uri, path)

    def delete(self, uri: S3Uri) -> None:
        self._allow(uri, write=True)
        self.store.delete(uri)

    # -- the S3-compatible API's calls (api/s3), under the same rule --
    def stat(self, uri: S3Uri) -> ObjectInfo | None:
        self._allow(uri, write=False)
        return self.store.stat(uri)

    def list_objects(self, prefix: S3Uri) -> list[ObjectInfo]:
        self._allow(prefix, write=False)
        return self.store.list_objects(prefix)

    def open_object(self, uri: S3Uri, start: int = 0, end: int | None = None) -> BinaryIO:
        self._allow(uri, write=False)
        return self.store.open_object(uri, start, end)

    def adopt_file(self, uri: S3Uri, path: Path) -> None:
        """Store `path` as `uri` if the bucket is this account's as it is written:
        AccessDenied once it is another's, NoSuchBucket once it is gone (`path` is kept)."""
        self._allow(uri, write=True)
        try:
            self.store.adopt_file(uri, path, owner=self.account_id)
        except OwnerChanged as exc:
            self._mine.discard(uri.bucket)
            raise AccessDenied(str(uri), uri.bucket, self.account_id) from exc

    def check_read(self, bucket: str) -> None:
        """AccessDenied unless this account may read `bucket` (HeadBucket)."""
        self._allow(S3Uri(bucket, ""), write=False)

    def check_write(self, bucket: str) -> None:
        """AccessDenied unless this account may write into `bucket` (claims an unowned
        one: the first writer owns it)."""
        self._allow(S3Uri(bucket, ""), write=True)

    def my_buckets(self) -> dict[str, float]:
        """The buckets this account owns -> creation time (never another account's)."""
        return self.store.buckets_of(self.account_id)

    def create_bucket(self, bucket: str, limit: int = 0) -> None:
        """Claim `bucket` and make it exist; BucketTaken when it already has an owner,
        TooManyBuckets when the account would own more than `limit` (0: no limit; counted
        again after the claim, so concurrent creates never pass it together)."""
        owner = self.store.owner(bucket)
        if owner is not None:
            raise BucketTaken(bucket, owner == self.account_id)
        if limit and len(self.store.buckets_of(self.account_id)) >= limit:
            raise TooManyBuckets(bucket, limit)
        self.store.create_bucket(bucket)  # first: S3 keeps the owner record in the bucket
        if self.store.claim(bucket, self.account_id) != self.account_id:
            raise BucketTaken(bucket, False)  # another account's claim came first
        if limit and len(self.store.buckets_of(self.account_id)) > limit:
            try:  # a concurrent create took the last place
                self.store.delete_bucket(bucket)
            except BucketNotEmpty:  # a folder that was there, no account's: left so
                self.store.release(bucket)
            raise TooManyBuckets(bucket, limit)
        self._mine.add(bucket)

    def delete_bucket(self, bucket: str) -> None:
        """Delete this account's empty bucket (AccessDenied for any other, an unowned one
        included; BucketNotEmpty when it holds objects)."""
        if self.store.owner(bucket) != self.account_id:
            raise AccessDenied(f"s3://{bucket}", bucket, self.account_id)
        self.store.delete_bucket(bucket)
        self._mine.discard(bucket)
