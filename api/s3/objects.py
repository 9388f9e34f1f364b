"""Object operations: PutObject, GetObject (with Range), HeadObject, DeleteObject,
DeleteObjects, CopyObject. Every store call goes through the caller's account view.

A write (PutObject, CopyObject) is checked before its body is read (the bucket, the
caller's right to write into it, the quota for a declared size), received into a staging
file as it arrives (counted against the quota as it comes: api/s3/quota.py), and then made
the object at once, the bucket's owner checked again as it is (foundation/store/storage.py
adopt_file): a bucket deleted and re-created by another account meanwhile is AccessDenied,
one deleted NoSuchBucket, and nothing is written."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from urllib.parse import unquote

from eaglenest.api.s3.body import expected_size, read_small, receive_object
from eaglenest.api.s3.errors import S3Error, from_storage, no_such_key
from eaglenest.api.s3.quota import Meter
from eaglenest.api.s3.request import (
    MAX_KEY_BYTES,
    Reply,
    S3Request,
    http_time,
    iso_time,
    node,
    parse_xml,
    root,
    xml_reply,
)
from eaglenest.api.s3.store_access import MAX_OBJECT, require_bucket, run, staging_file
from eaglenest.foundation.store.storage import ObjectInfo, S3Uri, StorageError, parse_uri

_RANGE = re.compile(r"^bytes=([0-9]*)-([0-9]*)$")
#: the most digits a Range position may have (2**63 has 19): more is InvalidRange
_MAX_DIGITS = 19
DEFAULT_TYPE = "binary/octet-stream"


def adopt(req: S3Request, uri: S3Uri, tmp: Path) -> ObjectInfo:
    """Make the staged file `tmp` the object `uri` (removing `tmp` in every case), the
    bucket still the caller's as it is written; its info. A key the store cannot hold (a
    folder of that name is there) is InvalidArgument."""
    try:
        req.store.adopt_file(uri, tmp)
    except OSError as exc:
        raise S3Error("InvalidArgument", f"{uri}: the store cannot hold this key beside the "
                      f"keys already there ({exc.strerror})", req.resource) from exc
    finally:
        tmp.unlink(missing_ok=True)
    info = req.store.stat(uri)
    if info is None:
        raise S3Error("InternalError", f"{uri} vanished as it was written", req.resource)
    return info


def _size_of(req: S3Request, uri: S3Uri) -> int:
    """The size of the object `uri` (0: none), which a write would replace."""
    old = req.store.stat(uri)
    return old.size if old else 0


async def put_object(req: S3Request) -> Reply:
    if "x-amz-copy-source" in req.headers:
        return await copy_object(req)
    uri = req.uri()
    await require_bucket(req)
    await run(req.store.check_write, req.bucket)
    tmp = staging_file(req, "put")
    try:
        with Meter(req, partial(_size_of, req, uri)) as meter:
            await meter.start(expected_size(req))
            size = await receive_object(req, tmp, MAX_OBJECT, meter.add)
            info = await meter.commit(size, partial(adopt, req, uri, tmp))
    finally:
        tmp.unlink(missing_ok=True)
    return Reply(200, headers={"etag": info.etag})


def _range(req: S3Request, size: int) -> tuple[int, int] | None:
    """(first, last) byte of a satisfiable `Range: bytes=a-b`; None for none or one S3
    ignores (several ranges, another unit); InvalidRange when it asks past the end."""
    m = _RANGE.match(req.headers.get("range", "").strip())
    if m is None or not (m[1] or m[2]):
        return None
    if len(m[1]) > _MAX_DIGITS or len(m[2]) > _MAX_DIGITS:
        raise _unsatisfiable(req, size)
    if not m[1]:  # the last n bytes
        n = int(m[2])
        if n == 0:
            raise _unsatisfiable(req, size)
        return max(0, size - n), size - 1
    first = int(m[1])
    last = min(int(m[2]), size - 1) if m[2] else size - 1
    if first >= size or (m[2] and int(m[2]) < first):
        raise _unsatisfiable(req, size)
    return first, last


def _unsatisfiable(req: S3Request, size: int) -> S3Error:
    err = S3Error("InvalidRange", "The requested range is not satisfiable", req.resource)
    err.headers["content-range"] = f"bytes */{size}"
    return err


def _object_headers(info: ObjectInfo) -> dict[str, str]:
    return {"etag": info.etag, "last-modified": http_time(info.mtime),
            "accept-ranges": "bytes", "content-type": DEFAULT_TYPE}


async def _described(req: S3Request) -> tuple[S3Uri, ObjectInfo]:
    uri = req.uri()
    await require_bucket(req)
    info = await run(req.store.stat, uri)
    if info is None:
        raise no_such_key(req.resource)
    return uri, info


async def get_object(req: S3Request, head: bool = False) -> Reply:
    uri, info = await _described(req)
    headers = _object_headers(info)
    span = _range(req, info.size)
    first, last = span if span else (0, info.size - 1)
    if span:
        headers["content-range"] = f"bytes {first}-{last}/{info.size}"
    reply = Reply(206 if span else 200, headers=headers, length=last - first + 1)
    if not head and reply.length > 0:
        reply.stream = await run(req.store.open_object, uri, first, last)
    return reply


async def head_object(req: S3Request) -> Reply:
    return await get_object(req, head=True)


async def delete_object(req: S3Request) -> Reply:
    uri = req.uri()
    await require_bucket(req)
    await run(req.store.delete, uri)
    return Reply(204)


def _delete_many(req: S3Request, keys: list[str]) -> list[tuple[str, S3Error | None]]:
    done: list[tuple[str, S3Error | None]] = []
    for key in keys:
        resource = f"/{req.bucket}/{key}"
        try:
            if len(key.encode()) > MAX_KEY_BYTES:
                raise S3Error("KeyTooLongError", "Your key is too long", resource)
            req.store.delete(parse_uri(f"s3://{req.bucket}/{key}"))
            done.append((key, None))
        except S3Error as exc:
            done.append((key, exc))
        except StorageError as exc:
            done.append((key, from_storage(exc, resource)))
    return done


async def delete_objects(req: S3Request) -> Reply:
    doc = parse_xml(await read_small(req), req.resource)
    await require_bucket(req)
    keys = [el.findtext("Key") or "" for el in doc.findall("Object")]
    if not keys or len(keys) > 1000 or not all(keys):
        raise S3Error("MalformedXML", "The XML you provided was not well-formed or did not "
                      "validate against our published schema: DeleteObjects takes 1 to 1000 "
                      "Object elements, each with a non-empty Key", req.resource)
    quiet = (doc.findtext("Quiet") or "").strip().lower() == "true"
    out = root("DeleteResult")
    for key, err in await run(_delete_many, req, keys):
        if err is None and not quiet:
            node(node(out, "Deleted"), "Key", key)
        elif err is not None:
            el = node(out, "Error")
            node(el, "Key", key)
            node(el, "Code", err.code)
            node(el, "Message", err.message)
    return xml_reply(out)


def _copy_source(req: S3Request) -> S3Uri:
    source = unquote(req.headers["x-amz-copy-source"].split("?versionId=")[0]).lstrip("/")
    try:
        return parse_uri(f"s3://{source}")
    except StorageError as exc:
        raise S3Error("InvalidArgument", f"x-amz-copy-source: {exc}", req.resource) from exc


def _copy_to(req: S3Request, src: S3Uri, tmp: Path) -> None:
    with req.store.open_object(src) as reader, tmp.open("wb") as out:
        while block := reader.read(1024 * 1024):
            out.write(block)


async def copy_object(req: S3Request) -> Reply:
    """CopyObject (the source read and the target written through the caller's view)."""
    uri, src = req.uri(), _copy_source(req)
    await require_bucket(req)
    info = await run(req.store.stat, src)
    if info is None:
        raise no_such_key("/" + str(src).removeprefix("s3://"))
    await run(req.store.check_write, req.bucket)
    tmp = staging_file(req, "copy")
    try:
        with Meter(req, partial(_size_of, req, uri)) as meter:
            await meter.start(info.size)
            await run(_copy_to, req, src, tmp)
            size = tmp.stat().st_size
            meter.add(size)
            done = await meter.commit(size, partial(adopt, req, uri, tmp))
    finally:
        tmp.unlink(missing_ok=True)
    out = root("CopyObjectResult")
    node(out, "LastModified", iso_time(done.mtime))
    node(out, "ETag", done.etag)
    return xml_reply(out)
