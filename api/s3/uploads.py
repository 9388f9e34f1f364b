"""Multipart uploads in progress, staged under the data dir, outside the store.

Layout: `<data-dir>/s3-uploads/multipart/<account>/<upload id>/` holds `meta.json` (bucket,
key, initiation time) and, per part n, the file `<n>` and its record `<n>.json` (size,
ETag: a random token, unique to the part's upload, that Complete must quote back, time).
An upload is found only under the caller's account, for the same bucket and key: any other
gets NoSuchUpload. Its bytes count against the account's quota (foundation/store/disk_usage.py
staged_bytes) until Complete moves them into the store or Abort removes them.

An upload id is 32 hex digits: the initiation time in nanoseconds, then 64 random bits, so
ids sort by initiation (ListMultipartUploads lists a key's uploads in that order).

Every change to an upload (a part moved in, Complete or the sweeper taking it) happens under
the account's lock (api/s3/quota.py LEDGER): Complete and the sweeper first rename the
folder (`.completing-<id>`, `.expired-<id>`), so a part arriving after is NoSuchUpload.

`sweep` aborts uploads idle (no part received: the folder's modification time) for longer
than Settings.multipart_max_age, like S3's lifecycle rule AbortIncompleteMultipartUpload,
and removes what interrupted writes left (bodies staged by a process that is gone); the API
runs it in the background (`sweep_forever`, started by api/s3/__init__.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglenest.api.s3.errors import S3Error
from eaglenest.api.s3.quota import LEDGER
from eaglenest.api.s3.request import S3Request
from eaglenest.api.s3.store_access import run, staging_file
from eaglenest.foundation.settings import Settings
from eaglenest.foundation.store.disk_usage import MULTIPART_DIR

log = logging.getLogger("eaglenest.s3")
UPLOAD_ID = re.compile(r"^[0-9a-f]{32}$")
_ACCOUNT = re.compile(r"^\d{12}$")


@dataclass(frozen=True)
class Upload:
    id: str
    folder: Path
    bucket: str
    key: str
    initiated: float


def account_dir(req: S3Request) -> Path:
    return req.settings.data_dir / MULTIPART_DIR / req.store.account_id


def no_upload(req: S3Request) -> S3Error:
    return S3Error("NoSuchUpload", "The specified upload does not exist. The upload ID may "
                   "be invalid, or the upload may have been aborted or completed.",
                   req.resource)


def _read(folder: Path) -> Upload | None:
    try:
        meta = json.loads((folder / "meta.json").read_text())
        return Upload(folder.name, folder, str(meta["bucket"]), str(meta["key"]),
                      float(meta["initiated"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def create(req: S3Request) -> str:
    """A new upload of the caller's for the request's bucket and key; its id. A key the
    store cannot hold (KeyTooLong) is refused now, not at Complete."""
    req.store.check_write(req.bucket)
    req.store.stat(req.uri())
    upload_id = f"{time.time_ns():016x}{secrets.token_hex(8)}"[-32:]
    record = staging_file(req, "meta")
    record.write_text(json.dumps({"bucket": req.bucket, "key": req.key,
                                  "initiated": time.time()}))
    folder = account_dir(req) / upload_id
    try:
        folder.mkdir(parents=True)
        os.replace(record, folder / "meta.json")
    finally:
        record.unlink(missing_ok=True)
    return upload_id


def find(req: S3Request) -> Upload:
    """The caller's upload named by `uploadId`, for this bucket and key; NoSuchUpload for
    any other (a malformed id names no folder at all)."""
    upload_id = req.query.get("uploadId", "")
    if UPLOAD_ID.match(upload_id) is None:
        raise no_upload(req)
    upload = _read(account_dir(req) / upload_id)
    if upload is None or (upload.bucket, upload.key) != (req.bucket, req.key):
        raise no_upload(req)
    return upload


def parts(folder: Path) -> dict[int, dict[str, Any]]:
    """Part number -> its record (size, etag, mtime)."""
    found = {}
    for record in folder.glob("*.json"):
        if record.stem.isdigit():
            with contextlib.suppress(OSError, ValueError):
                found[int(record.stem)] = json.loads(record.read_text())
    return found


def part_size(folder: Path, number: int) -> int:
    try:
        return int(json.loads((folder / f"{number}.json").read_text())["size"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def put_part(req: S3Request, upload: Upload, number: int, data: Path, size: int,
             etag: str) -> None:
    """Move the received part `data` into `upload` with its record (call under the
    account's lock); NoSuchUpload once the upload is gone."""
    record = staging_file(req, "part-record")
    try:
        record.write_text(json.dumps({"size": size, "etag": etag, "mtime": time.time()}))
        if not (upload.folder / "meta.json").is_file():
            raise no_upload(req)
        os.replace(data, upload.folder / str(number))
        os.replace(record, upload.folder / f"{number}.json")
    except FileNotFoundError as exc:  # completed, aborted or swept meanwhile
        raise no_upload(req) from exc
    finally:
        record.unlink(missing_ok=True)


def take(req: S3Request, upload: Upload, why: str) -> Path:
    """Rename `upload`'s folder to `.<why>-<id>` (call under the account's lock): no part
    is added to it after; NoSuchUpload when it is gone already."""
    taken = upload.folder.with_name(f".{why}-{upload.id}")
    try:
        upload.folder.rename(taken)
    except FileNotFoundError as exc:
        raise no_upload(req) from exc
    os.utime(taken)  # its age starts again: the sweeper leaves it to its taker
    return taken


def of_bucket(req: S3Request) -> list[Upload]:
    """The caller's uploads in progress for this bucket, by key, then initiation."""
    folder = account_dir(req)
    found = [_read(p) for p in folder.iterdir()] if folder.is_dir() else []
    return sorted((u for u in found if u is not None and u.bucket == req.bucket
                   and UPLOAD_ID.match(u.id)), key=lambda u: (u.key, u.id))


def _idle(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except OSError:
        return 0.0


def _sweep_account(folder: Path, max_age: float, now: float) -> int:
    removed = 0
    for entry in list(folder.iterdir()):
        if not entry.is_dir() or _idle(entry, now) <= max_age:
            continue
        if UPLOAD_ID.match(entry.name):
            with LEDGER.lock(folder.name):  # never while a part moves in or Complete takes it
                taken = entry.with_name(f".expired-{entry.name}")
                try:
                    entry.rename(taken)
                except FileNotFoundError:
                    continue
            entry = taken
            removed += 1
        shutil.rmtree(entry, ignore_errors=True)  # or what a crash left (.completing-...)
    return removed


def sweep(data_dir: Path, max_age: float, started: float, now: float | None = None) -> int:
    """Abort the uploads idle longer than `max_age` seconds and remove files interrupted
    writes left (staged before `started`: by a process that is gone); how many uploads."""
    now = time.time() if now is None else now
    root = data_dir / MULTIPART_DIR
    removed = 0
    for entry in list(root.iterdir()) if root.is_dir() else []:
        if _ACCOUNT.match(entry.name) and entry.is_dir():
            removed += _sweep_account(entry, max_age, now)
        elif UPLOAD_ID.match(entry.name) and _idle(entry, now) > max_age:
            shutil.rmtree(entry, ignore_errors=True)  # an upload of the former layout
            removed += 1
    staging = data_dir / MULTIPART_DIR.parent
    for folder in (staging, staging / "incoming"):
        for entry in list(folder.iterdir()) if folder.is_dir() else []:
            with contextlib.suppress(OSError):
                if entry.is_file() and entry.stat().st_mtime < started:
                    entry.unlink()
    return removed


def interval(settings: Settings) -> float:
    """How often the sweeper runs: a quarter of the idle limit, between 0.2 s and 10 min."""
    return min(max(settings.multipart_max_age / 4, 0.2), 600.0)


async def sweep_forever(settings: Settings) -> None:
    """`sweep` at once, then every `interval`; a failure is logged and the loop goes on."""
    started = time.time()
    while True:
        try:
            removed = await run(sweep, settings.data_dir, settings.multipart_max_age, started)
            if removed:
                log.info("aborted %d multipart upload(s) idle for more than %.0f s "
                         "(EAGLENEST_MULTIPART_MAX_AGE)", removed, settings.multipart_max_age)
        except Exception:
            log.exception("the multipart upload sweeper failed; it runs again in %.0f s",
                          interval(settings))
        await asyncio.sleep(interval(settings))
