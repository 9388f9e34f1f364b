"""What the S3 handlers share: running store calls off the event loop, the bucket's
existence, the stored-bytes quota, the staging files of bodies."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from anyio import to_thread

from eaglenest.api.s3.errors import S3Error, no_such_bucket
from eaglenest.api.s3.request import S3Request
from eaglenest.foundation.disk_usage import (
    StoredBytesExceeded,
    account_bytes,
    exceeded_message,
)

T = TypeVar("T")
#: S3's largest PutObject and UploadPart body
MAX_OBJECT = 5 * 1024**3
#: S3's smallest part but the last
MIN_PART = 5 * 1024**2


async def run(fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` in a worker thread: store calls touch the disk or the network."""
    return await to_thread.run_sync(fn, *args)


def _bucket_exists(req: S3Request) -> bool:
    return req.store.store.bucket_exists(req.bucket)


async def require_bucket(req: S3Request) -> None:
    """NoSuchBucket unless the bucket exists (a folder or an owner record)."""
    if not await run(_bucket_exists, req):
        raise no_such_bucket(req.bucket)


def check_quota(req: S3Request, delta: int, replaced: int = 0) -> None:
    """QuotaExceeded when `delta` more bytes (less the `replaced` object's) would take the
    caller's account past Settings.max_stored_bytes (foundation/disk_usage.py)."""
    limit = req.settings.max_stored_bytes
    if not limit:
        return
    used = account_bytes(req.store.store, req.store.account_id) - replaced
    if used + delta > limit:
        raise StoredBytesExceeded(exceeded_message(limit, max(0, used), delta))


def staging_file(req: S3Request, kind: str) -> Path:
    """A new file name under the staging folder (the data dir's s3-uploads/)."""
    req.staging.mkdir(parents=True, exist_ok=True)
    return req.staging / f"{kind}-{uuid.uuid4().hex}"


def bad_request(req: S3Request, code: str, message: str) -> S3Error:
    return S3Error(code, message, req.resource)
