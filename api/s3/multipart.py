"""Multipart upload: CreateMultipartUpload, UploadPart, CompleteMultipartUpload,
AbortMultipartUpload, ListParts, ListMultipartUploads.

Uploads are staged outside the store (api/s3/uploads.py: per account, only the account
that created one sees or uses it). A part's bytes count against the account's quota as they
arrive (api/s3/quota.py) and stay counted until Complete moves them into the store (the
parts named, in order, into one file, renamed into place whole: foundation/store/storage.py
adopt_file, the bucket's owner checked as it is) or Abort removes them. Uploads idle longer
than EAGLENEST_MULTIPART_MAX_AGE are aborted by the API's sweeper. The listings page as
S3's do: ListParts by part-number-marker, ListMultipartUploads by key-marker and
upload-id-marker (an upload's key, then its id; ids sort by initiation), with prefix,
delimiter (CommonPrefixes) and encoding-type=url."""

from __future__ import annotations

import shutil
import uuid
import xml.etree.ElementTree as ET
from functools import partial
from pathlib import Path
from typing import Any

from eaglenest.api.s3 import uploads
from eaglenest.api.s3.body import expected_size, read_small, receive_object
from eaglenest.api.s3.errors import S3Error
from eaglenest.api.s3.objects import adopt
from eaglenest.api.s3.quota import LEDGER, Meter
from eaglenest.api.s3.request import Reply, S3Request, iso_time, node, parse_xml, root, xml_reply
from eaglenest.api.s3.store_access import MAX_OBJECT, MIN_PART, require_bucket, run, staging_file
from eaglenest.api.s3.upload_pages import list_uploads, owner_nodes
from eaglenest.foundation.store.disk_usage import UPLOAD_OVERHEAD

__all__ = ["abort_upload", "complete_upload", "create_upload", "list_parts", "list_uploads",
           "upload_part"]
MAX_PARTS = 10000


async def create_upload(req: S3Request) -> Reply:
    req.uri()
    await require_bucket(req)
    with Meter(req) as meter:  # an upload's folder and records count too
        await meter.start(UPLOAD_OVERHEAD)
        upload_id = await meter.commit(UPLOAD_OVERHEAD, partial(uploads.create, req))
    out = root("InitiateMultipartUploadResult")
    node(out, "Bucket", req.bucket)
    node(out, "Key", req.key)
    node(out, "UploadId", upload_id)
    return xml_reply(out)


def _part_number(req: S3Request) -> int:
    text = req.query.get("partNumber", "")
    if not (text.isascii() and text.isdigit() and len(text) <= 5
            and 1 <= int(text) <= MAX_PARTS):
        raise S3Error("InvalidArgument", f"Part number must be an integer between 1 and "
                      f"{MAX_PARTS}, inclusive", req.resource)
    return int(text)


async def upload_part(req: S3Request) -> Reply:
    if "x-amz-copy-source" in req.headers:
        raise S3Error("NotImplemented", "UploadPartCopy is not supported", req.resource)
    number = _part_number(req)
    upload = await run(uploads.find, req)
    tmp = staging_file(req, "part")
    etag = f'"{uuid.uuid4().hex}"'
    try:
        with Meter(req, partial(uploads.part_size, upload.folder, number)) as meter:
            await meter.start(expected_size(req))
            size = await receive_object(req, tmp, MAX_OBJECT, meter.add)
            await meter.commit(size, partial(uploads.put_part, req, upload, number, tmp,
                                             size, etag))
    finally:
        tmp.unlink(missing_ok=True)
    return Reply(200, headers={"etag": etag})


def _chosen(req: S3Request, doc_parts: list[tuple[int, str]],
            staged: dict[int, dict[str, Any]]) -> None:
    """S3's errors for a wrong list of parts."""
    numbers = [n for n, _ in doc_parts]
    if not numbers:
        raise S3Error("MalformedXML", "CompleteMultipartUpload names no part", req.resource)
    if numbers != sorted(set(numbers)):
        raise S3Error("InvalidPartOrder", "The list of parts was not in ascending order. "
                      "Parts must be ordered by part number.", req.resource)
    for i, (number, etag) in enumerate(doc_parts):
        part = staged.get(number)
        if part is None or part["etag"].strip('"') != etag.strip().strip('"'):
            raise S3Error("InvalidPart", f"Part {number} was not uploaded, or its ETag does "
                          "not match.", req.resource)
        if i < len(doc_parts) - 1 and part["size"] < MIN_PART:
            raise S3Error("EntityTooSmall", f"Part {number} is smaller than the minimum "
                          f"allowed size ({MIN_PART} bytes) and is not the last.",
                          req.resource)


def _take(req: S3Request, upload: uploads.Upload, doc_parts: list[tuple[int, str]]) -> Path:
    """Check the list against the parts and take the upload for Complete (no part comes
    in after). Its bytes stay counted (staged) until the object is in place."""
    with LEDGER.lock(req.store.account_id):
        _chosen(req, doc_parts, uploads.parts(upload.folder))
        return uploads.take(req, upload, "completing")


def _complete(req: S3Request, upload: uploads.Upload,
              doc_parts: list[tuple[int, str]]) -> str:
    uri = req.uri()
    work = _take(req, upload, doc_parts)
    whole = work / "whole"
    try:
        with whole.open("wb") as out:
            for number, _ in doc_parts:
                with (work / str(number)).open("rb") as part:
                    shutil.copyfileobj(part, out, 1024 * 1024)
        info = adopt(req, uri, whole)
    except BaseException:
        whole.unlink(missing_ok=True)
        work.rename(upload.folder)  # the upload stays as it was: Complete may be retried
        raise
    shutil.rmtree(work, ignore_errors=True)
    return info.etag


async def complete_upload(req: S3Request) -> Reply:
    upload = await run(uploads.find, req)
    doc = parse_xml(await read_small(req), req.resource)
    try:
        doc_parts = [(int(el.findtext("PartNumber") or ""), el.findtext("ETag") or "")
                     for el in doc.findall("Part")]
    except ValueError as exc:
        raise S3Error("MalformedXML", "PartNumber must be an integer", req.resource) from exc
    etag = await run(_complete, req, upload, doc_parts)
    out = root("CompleteMultipartUploadResult")
    node(out, "Location", f"/{req.bucket}/{req.key}")
    node(out, "Bucket", req.bucket)
    node(out, "Key", req.key)
    node(out, "ETag", etag)
    return xml_reply(out)


def _abort(req: S3Request, upload: uploads.Upload) -> None:
    with LEDGER.lock(req.store.account_id):
        taken = uploads.take(req, upload, "expired")
    shutil.rmtree(taken, ignore_errors=True)


async def abort_upload(req: S3Request) -> Reply:
    upload = await run(uploads.find, req)
    await run(_abort, req, upload)
    return Reply(204)


def _int_query(req: S3Request, name: str, default: int, low: int, high: int) -> int:
    text = req.query.get(name, "")
    if not text:
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= 10):
        raise S3Error("InvalidArgument", f"{name} must be an integer between {low} and "
                      f"2147483647", req.resource)
    return max(low, min(int(text), high))


async def list_parts(req: S3Request) -> Reply:
    upload = await run(uploads.find, req)
    staged = await run(uploads.parts, upload.folder)
    marker = _int_query(req, "part-number-marker", 0, 0, MAX_PARTS)
    max_parts = _int_query(req, "max-parts", 1000, 0, 1000)
    numbers = [n for n in sorted(staged) if n > marker]
    shown, truncated = numbers[:max_parts], len(numbers) > max_parts
    out = root("ListPartsResult")
    for name, value in (("Bucket", req.bucket), ("Key", req.key), ("UploadId", upload.id)):
        node(out, name, value)
    owner_nodes(req, out)
    node(out, "StorageClass", "STANDARD")
    node(out, "PartNumberMarker", marker)
    if shown:
        node(out, "NextPartNumberMarker", shown[-1])
    node(out, "MaxParts", max_parts)
    node(out, "IsTruncated", "true" if truncated else "false")
    for number in shown:
        _part_node(out, number, staged[number])
    return xml_reply(out)


def _part_node(out: ET.Element, number: int, part: dict[str, Any]) -> None:
    el = node(out, "Part")
    node(el, "PartNumber", number)
    node(el, "LastModified", iso_time(part.get("mtime", 0)))
    node(el, "ETag", part["etag"])
    node(el, "Size", part["size"])
