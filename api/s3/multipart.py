"""Multipart upload: CreateMultipartUpload, UploadPart, CompleteMultipartUpload,
AbortMultipartUpload, ListParts.

An upload is a folder `<data-dir>/s3-uploads/multipart/<upload id>/` (outside the store:
its parts are no object, and a part is no key): `meta.json` names the bucket, key and
account, each part is `<n>` with its `<n>.json` (size, ETag: a random token, unique to the
part's upload, that Complete must quote back). Only the account that created an upload, for
the same bucket and key, can see or use it: any other gets NoSuchUpload. Complete appends
the parts into the first one and moves it into the store whole (foundation/storage.py
adopt_file), then removes the folder. Abandoned uploads are kept until aborted."""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from eaglenest.api.s3.body import expected_size, read_small, receive_object
from eaglenest.api.s3.common import MAX_OBJECT, MIN_PART, check_quota, require_bucket, run
from eaglenest.api.s3.errors import S3Error
from eaglenest.api.s3.objects import adopt
from eaglenest.api.s3.request import Reply, S3Request, iso_time, node, parse_xml, root, xml_reply

_UPLOAD_ID = re.compile(r"^[0-9a-f]{32}$")
MAX_PARTS = 10000


def _folder(req: S3Request, upload_id: str) -> Path:
    return req.staging / "multipart" / upload_id


def _no_upload(req: S3Request) -> S3Error:
    return S3Error("NoSuchUpload", "The specified upload does not exist. The upload ID may "
                   "be invalid, or the upload may have been aborted or completed.",
                   req.resource)


def _open(req: S3Request) -> Path:
    """The caller's upload named by `uploadId`, for this bucket and key; NoSuchUpload for
    any other (a malformed id names no folder at all)."""
    upload_id = req.query.get("uploadId", "")
    if _UPLOAD_ID.match(upload_id) is None:
        raise _no_upload(req)
    folder = _folder(req, upload_id)
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise _no_upload(req) from exc
    if (meta.get("account"), meta.get("bucket"), meta.get("key")) != \
            (req.store.account_id, req.bucket, req.key):
        raise _no_upload(req)
    return folder


def _parts(folder: Path) -> dict[int, dict[str, Any]]:
    found = {}
    for record in folder.glob("*.json"):
        if record.stem.isdigit():
            found[int(record.stem)] = json.loads(record.read_text())
    return found


def _create(req: S3Request) -> str:
    req.store.check_write(req.bucket)
    upload_id = uuid.uuid4().hex
    folder = _folder(req, upload_id)
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({
        "account": req.store.account_id, "bucket": req.bucket, "key": req.key,
        "initiated": time.time()}))
    return upload_id


async def create_upload(req: S3Request) -> Reply:
    req.uri()
    await require_bucket(req)
    upload_id = await run(_create, req)
    out = root("InitiateMultipartUploadResult")
    node(out, "Bucket", req.bucket)
    node(out, "Key", req.key)
    node(out, "UploadId", upload_id)
    return xml_reply(out)


def _part_number(req: S3Request) -> int:
    text = req.query.get("partNumber", "")
    if not text.isdigit() or not 1 <= int(text) <= MAX_PARTS:
        raise S3Error("InvalidArgument", f"Part number must be an integer between 1 and "
                      f"{MAX_PARTS}, inclusive", req.resource)
    return int(text)


def _staged(folder: Path, skip: int) -> int:
    return sum(p["size"] for n, p in _parts(folder).items() if n != skip)


async def upload_part(req: S3Request) -> Reply:
    if "x-amz-copy-source" in req.headers:
        raise S3Error("NotImplemented", "UploadPartCopy is not supported", req.resource)
    number = _part_number(req)
    folder = await run(_open, req)
    declared = expected_size(req)
    if declared is not None:  # this upload's other parts count as if stored already
        await run(check_quota, req, declared + await run(_staged, folder, number))
    tmp = folder / f"{number}.{uuid.uuid4().hex}.tmp"
    size = await receive_object(req, tmp, MAX_OBJECT)
    etag = f'"{uuid.uuid4().hex}"'
    tmp.replace(folder / str(number))
    (folder / f"{number}.json").write_text(json.dumps({"size": size, "etag": etag,
                                                       "mtime": time.time()}))
    return Reply(200, headers={"etag": etag})


def _chosen(req: S3Request, doc_parts: list[tuple[int, str]],
            staged: dict[int, dict[str, Any]]) -> int:
    """The total size of the parts Complete names; S3's errors for a wrong list."""
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
    return sum(staged[n]["size"] for n in numbers)


def _assemble(req: S3Request, folder: Path, numbers: list[int]) -> Path:
    """The parts appended, in order, into the first one's file."""
    first = folder / str(numbers[0])
    with first.open("ab") as out:
        for number in numbers[1:]:
            with (folder / str(number)).open("rb") as part:
                shutil.copyfileobj(part, out, 1024 * 1024)
    return first


def _complete(req: S3Request, folder: Path, doc_parts: list[tuple[int, str]]) -> str:
    uri = req.uri()
    total = _chosen(req, doc_parts, _parts(folder))
    old = req.store.stat(uri)
    check_quota(req, total, old.size if old else 0)
    whole = _assemble(req, folder, [n for n, _ in doc_parts])
    info = adopt(req, uri, whole)
    shutil.rmtree(folder, ignore_errors=True)
    return info.etag


async def complete_upload(req: S3Request) -> Reply:
    folder = await run(_open, req)
    doc = parse_xml(await read_small(req), req.resource)
    try:
        doc_parts = [(int(el.findtext("PartNumber") or ""), el.findtext("ETag") or "")
                     for el in doc.findall("Part")]
    except ValueError as exc:
        raise S3Error("MalformedXML", "PartNumber must be an integer", req.resource) from exc
    etag = await run(_complete, req, folder, doc_parts)
    out = root("CompleteMultipartUploadResult")
    node(out, "Location", f"/{req.bucket}/{req.key}")
    node(out, "Bucket", req.bucket)
    node(out, "Key", req.key)
    node(out, "ETag", etag)
    return xml_reply(out)


async def abort_upload(req: S3Request) -> Reply:
    folder = await run(_open, req)
    await run(shutil.rmtree, folder, True)
    return Reply(204)


async def list_parts(req: S3Request) -> Reply:
    folder = await run(_open, req)
    staged = await run(_parts, folder)
    out = root("ListPartsResult")
    node(out, "Bucket", req.bucket)
    node(out, "Key", req.key)
    node(out, "UploadId", req.query["uploadId"])
    node(out, "IsTruncated", "false")
    for number in sorted(staged):
        el = node(out, "Part")
        node(el, "PartNumber", number)
        node(el, "LastModified", iso_time(staged[number].get("mtime", 0)))
        node(el, "ETag", staged[number]["etag"])
        node(el, "Size", staged[number]["size"])
    return xml_reply(out)
