"""What an account holds in the artifact store, and its quota (EAGLENEST_MAX_STORED_BYTES).

Contract:
- `account_bytes(store, account)` = the bytes of every object in the buckets `account` owns
  (foundation/storage.py owner records): job outputs, checkpoints and training logs, Data
  Capture files, and whatever was uploaded for the account (`eaglenest s3 cp`). A bucket
  belongs to at most one account, so no byte counts twice; a bucket no account owns counts
  for none. The local store walks `<root>/<bucket>`; S3 lists every bucket's objects
  (ListBuckets, then ListObjectsV2). A store of another kind counts 0.
- `check_stored(store, limit, delta, replacing)` raises `StoredBytesExceeded` (a
  StorageError: a job's FailureReason as it stands) when writing `delta` more bytes would
  take the account past `limit`; what is under `replacing` (the job's own output prefix,
  about to be rewritten or cleared) does not count. Measured, not reserved: two writers at
  once may pass it together by what they write.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from eaglenest.foundation.storage import RESERVED_PREFIX, ArtifactStore, S3Uri, StorageError


class StoredBytesExceeded(StorageError):
    """Writing more would take an account past EAGLENEST_MAX_STORED_BYTES."""


def exceeded_message(limit: int, used: int, delta: int) -> str:
    return (f"ResourceLimitExceeded: The account-level service limit 'bytes stored' is "
            f"{limit} Bytes, with current utilization of {used} Bytes and a request delta "
            f"of {delta} Bytes (the objects in the buckets the account owns: job outputs, "
            f"Data Capture, uploads). Ask the operator to raise EAGLENEST_MAX_STORED_BYTES, "
            f"or delete objects the account no longer needs.")


def dir_bytes(path: Path) -> int:
    """Bytes of the regular files under `path` (0 when it does not exist)."""
    total = 0
    for p in path.rglob("*") if path.is_dir() else []:
        with contextlib.suppress(OSError):  # removed meanwhile
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
    return total


def _unwrap(store: Any) -> tuple[Any, str | None]:
    """The whole store behind an account's view (foundation/buckets.AccountStore) and the
    view's account (None for a whole store)."""
    inner = getattr(store, "store", None)
    if inner is not None and hasattr(store, "account_id"):
        return inner, str(store.account_id)
    return store, None


def _s3_bytes(client: Any, bucket: str, prefix: str = "") -> int:
    total = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        total += sum(int(o["Size"]) for o in page.get("Contents", [])
                     if not o["Key"].startswith(RESERVED_PREFIX))
    return total


def account_bytes(store: Any, account_id: str) -> int:
    """The bytes in the buckets `account_id` owns (module docstring)."""
    whole, _ = _unwrap(store)
    root = getattr(whole, "root", None)
    if isinstance(root, Path):
        owners = root / ".owners"
        total = 0
        for record in owners.iterdir() if owners.is_dir() else []:
            if record.name.startswith("."):
                continue  # a claim being written
            with contextlib.suppress(OSError):
                if record.read_text().strip() == account_id:
                    total += dir_bytes(root / record.name)
        return total
    client = getattr(whole, "client", None)
    if client is None or not hasattr(whole, "owner"):
        return 0
    buckets = [b["Name"] for b in client.list_buckets().get("Buckets", [])]
    return sum(_s3_bytes(client, b) for b in buckets if whole.owner(b) == account_id)


def prefix_bytes(store: Any, prefix: S3Uri) -> int:
    """The bytes of the objects under `prefix` (a key ending in '/')."""
    whole, _ = _unwrap(store)
    root = getattr(whole, "root", None)
    if isinstance(root, Path):
        return dir_bytes(root / prefix.bucket / prefix.key)
    client = getattr(whole, "client", None)
    return _s3_bytes(client, prefix.bucket, prefix.key) if client is not None else 0


def clear_prefix(store: ArtifactStore, prefix: S3Uri) -> None:
    """Delete every object under `prefix` (through `store`, an account's view)."""
    for key in store.list_keys(prefix):
        store.delete(S3Uri(prefix.bucket, key))


def check_stored(store: ArtifactStore, limit: int, delta: int, replacing: S3Uri) -> None:
    """StoredBytesExceeded when `delta` more bytes take the account of `store` (its view)
    past `limit` (0: no limit); the bytes under `replacing` do not count."""
    whole, account = _unwrap(store)
    if not limit or account is None:
        return
    used = account_bytes(whole, account) - prefix_bytes(whole, replacing)
    if used + delta > limit:
        raise StoredBytesExceeded(exceeded_message(limit, max(0, used), delta))
