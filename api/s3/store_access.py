"""What the S3 handlers share: running store calls off the event loop, the bucket's
existence, the staging files of bodies (the quota: api/s3/quota.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from anyio import to_thread

from eaglenest.api.s3.errors import S3Error, no_such_bucket
from eaglenest.api.s3.request import S3Request

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


def incoming(req: S3Request) -> Path:
    """Where bodies are written as they arrive (`<data-dir>/s3-uploads/incoming/`): out of
    every bucket, and out of what the quota measures (bodies in flight are reserved
    instead: api/s3/quota.py)."""
    return req.staging / "incoming"


def staging_file(req: S3Request, kind: str) -> Path:
    """A new file name in `incoming(req)`."""
    folder = incoming(req)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{kind}-{uuid.uuid4().hex}"


def bad_request(req: S3Request, code: str, message: str) -> S3Error:
    return S3Error(code, message, req.resource)
