"""Object operations: PutObject, GetObject (with Range), HeadObject, DeleteObject,
DeleteObjects, CopyObject. Every store call goes through the caller's account view."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

from eaglenest.api.s3.body import expected_size, read_small, receive_object
from eaglenest.api.s3.common import (
    MAX_OBJECT,
    check_quota,
    require_bucket,
    run,
    staging_file,
)
from eaglenest.api.s3.errors import S3Error, from_storage, no_such_key
from eaglenest.api.s3.request import (
    Reply,
    S3Request,
    http_time,
    iso_time,
    node,
    parse_xml,
    root,
    xml_reply,
)
from eaglenest.foundation.storage import ObjectInfo, S3Uri, StorageError, parse_uri

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
DEFAULT_TYPE = "binary/octet-stream"


def adopt(req: S3Request, uri: S3Uri, tmp: Path) -> ObjectInfo:
    """Make the staged file `tmp` the object `uri` (removing `tmp` in every case); its
    info. A key the store cannot hold (a folder of that name is there) is InvalidArgument."""
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


async def receive_checked(req: S3Request, tmp: Path, replaced: int) -> int:
    """Receive the body into `tmp` within the quota (checked before reading when the size
    is declared, after it otherwise); its size."""
    declared = expected_size(req)
    if declared is not None:
        await run(check_quota, req, declared, replaced)
    size = await receive_object(req, tmp, MAX_OBJECT)
    if declared is None:
        try:
            await run(check_quota, req, size, replaced)
        except StorageError:
            tmp.unlink(missing_ok=True)
            raise
    return size


async def put_object(req: S3Request) -> Reply:
    if "x-amz-copy-source" in req.headers:
        return await copy_object(req)
    uri = req.uri()
    await require_bucket(req)
    await run(req.store.check_write, req.bucket)
    old = await run(req.store.stat, uri)
    tmp = staging_file(req, "put")
    await receive_checked(req, tmp, old.size if old else 0)
    info = await run(adopt, req, uri, tmp)
    return Reply(200, headers={"etag": info.etag})


def _range(req: S3Request, size: int) -> tuple[int, int] | None:
    """(first, last) byte of a satisfiable `Range: bytes=a-b`; None for none or one S3
    ignores (several ranges, another unit); InvalidRange when it asks past the end."""
    m = _RANGE.match(req.headers.get("range", "").strip())
    if m is None or not (m[1] or m[2]):
        return None
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
        try:
            req.store.delete(parse_uri(f"s3://{req.bucket}/{key}"))
            done.append((key, None))
        except StorageError as exc:
            done.append((key, from_storage(exc, f"/{req.bucket}/{key}")))
    return done


async def delete_objects(req: S3Request) -> Reply:
    doc = parse_xml(await read_small(req), req.resource)
    await require_bucket(req)
    keys = [el.findtext("Key") or "" for el in doc.findall("Object")]
    if not keys or len(keys) > 1000:
        raise S3Error("MalformedXML", "DeleteObjects takes 1 to 1000 keys", req.resource)
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
    old = await run(req.store.stat, uri)
    await run(check_quota, req, info.size, old.size if old else 0)
    tmp = staging_file(req, "copy")
    try:
        await run(_copy_to, req, src, tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    done = await run(adopt, req, uri, tmp)
    out = root("CopyObjectResult")
    node(out, "LastModified", iso_time(done.mtime))
    node(out, "ETag", done.etag)
    return xml_reply(out)
