"""Buckets belong to accounts: the view of the artifact store one account's accesses go
through (jobs, endpoints, Data Capture, `eaglenest s3`), and the error it raises.

The owner records themselves live in the store (`BucketStore.owner` / `claim`,
foundation/storage.py), so the rule holds for the local store and for S3 alike.
"""

from __future__ import annotations

from pathlib import Path

from eaglenest.foundation.storage import BucketStore, S3Uri, StorageError


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


class AccountStore:
    """`store` as one account may use it: any read, list, write or delete in a bucket
    another account owns raises AccessDenied (naming the URI); a write or delete in a bucket
    no account owns claims it for this account first (the first writer owns a bucket); a
    read of one is allowed only to the store's default account (`store.default_account`,
    the operator's) and claims nothing. A bucket found to be this account's is not asked
    again for the life of the view (make one per job run, deployment or upload)."""

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
