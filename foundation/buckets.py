"""Buckets belong to accounts: the view of the artifact store one account's accesses go
through (jobs, endpoints, Data Capture, `eaglenest s3`), and the error it raises.

The owner records themselves live in the store (`BucketStore.owner` / `claim`,
foundation/storage.py), so the rule holds for the local store and for S3 alike.
"""

from __future__ import annotations

from pathlib import Path

from eaglenest.foundation.storage import BucketStore, S3Uri, StorageError


class AccessDenied(StorageError):
    """An access for one account to a bucket another account owns."""

    def __init__(self, uri: str, bucket: str, account_id: str) -> None:
        super().__init__(f"AccessDenied: {uri}: bucket '{bucket}' belongs to another account "
                         f"than {account_id}")
        self.uri, self.bucket, self.account_id = uri, bucket, account_id


class AccountStore:
    """`store` as one account may use it: any read, list, write or delete in a bucket
    another account owns raises AccessDenied (naming the URI); a write or delete in a bucket
    no account owns claims it for this account first; a read of one is allowed. A bucket
    found to be this account's is not asked again for the life of the view (make one per
    job run, deployment or upload)."""

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
