"""What an account holds in the artifact store, and its quota (EAGLENEST_MAX_STORED_BYTES).

Contract:
- `account_bytes(store, account)` = the bytes of every object in the buckets `account` owns
  (foundation/store/storage.py owner records): job outputs, checkpoints and training logs, Data
  Capture files, and whatever was uploaded for the account (`eaglenest s3 cp`). A bucket
  belongs to at most one account, so no byte counts twice; a bucket no account owns counts
  for none. The account's buckets come from `BucketStore.buckets_of` (the local store's
  per-account index: no other account's record is read); the local store walks
  `<root>/<bucket>`, S3 lists each bucket's objects (ListObjectsV2). A store of another
  kind counts 0.
- `staged_bytes(data_dir, account)` = the bytes of the account's multipart uploads in
  progress (`<data-dir>/s3-uploads/multipart/<account>/`, api/s3/uploads.py), each upload
  counting `UPLOAD_OVERHEAD` besides its files; the S3 API adds them to `account_bytes`.
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

from eaglenest.foundation.store.storage import RESERVED_PREFIX, ArtifactStore, S3Uri, StorageError

#: where the S3 API stages multipart uploads, per account, under the data dir
MULTIPART_DIR = Path("s3-uploads") / "multipart"
#: what one upload in progress counts besides its parts (its folder and records)
UPLOAD_OVERHEAD = 4096


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
    """The whole store behind an account's view (foundation/store/buckets.AccountStore) and the
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
    if not hasattr(whole, "buckets_of"):
        return 0
    buckets = whole.buckets_of(account_id)
    root = getattr(whole, "root", None)
    if isinstance(root, Path):
        return sum(dir_bytes(root / name) for name in buckets)
    client = getattr(whole, "client", None)
    return sum(_s3_bytes(client, b) for b in buckets) if client is not None else 0


def staged_bytes(data_dir: Path, account_id: str) -> int:
    """The bytes of `account_id`'s multipart uploads in progress (module docstring)."""
    folder = data_dir / MULTIPART_DIR / account_id
    uploads = [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []
    return sum(dir_bytes(p) + UPLOAD_OVERHEAD for p in uploads)


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
