"""ListMultipartUploads: the caller's uploads in progress in one of its buckets (never
another account's: uploads are staged per account, api/s3/uploads.py), a page at a time.

Uploads are listed by key, then by upload id (ids sort by initiation). A page resumes
after `key-marker` (every upload of a greater key), or, with `upload-id-marker` too, after
that upload of that key; with a `delimiter`, the keys sharing a prefix up to it are one
CommonPrefixes entry, which counts once toward `max-uploads` (at most 1000) and, as a
key-marker, skips every key under it. NextKeyMarker and NextUploadIdMarker (empty after a
common prefix) name the last entry of a truncated page, as botocore's paginator expects."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from urllib.parse import quote

from eaglenest.api.s3 import uploads
from eaglenest.api.s3.errors import S3Error
from eaglenest.api.s3.request import Reply, S3Request, iso_time, node, root, xml_reply
from eaglenest.api.s3.store_access import require_bucket, run

MAX_UPLOADS = 1000


@dataclass
class UploadPage:
    uploads: list[uploads.Upload] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    truncated: bool = False
    next_key: str = ""
    next_id: str = ""


@dataclass(frozen=True)
class Query:
    prefix: str = ""
    delimiter: str = ""
    key_marker: str = ""
    id_marker: str = ""
    max_uploads: int = MAX_UPLOADS

    def skips(self, upload: uploads.Upload) -> bool:
        """Whether `upload` is before the page (markers) or outside it (prefix)."""
        key = upload.key
        if not key.startswith(self.prefix):
            return True
        if not self.key_marker:
            return False
        if self.delimiter and self.key_marker.endswith(self.delimiter) \
                and key.startswith(self.key_marker):
            return True  # under a common prefix a page before listed
        if self.id_marker:
            return (key, upload.id) <= (self.key_marker, self.id_marker)
        return key <= self.key_marker


def page(found: list[uploads.Upload], query: Query) -> UploadPage:
    """One page of the sorted uploads `found` (module docstring)."""
    out = UploadPage()
    for upload in found:
        if query.skips(upload):
            continue
        cut = upload.key.find(query.delimiter, len(query.prefix)) if query.delimiter else -1
        common = upload.key[:cut + len(query.delimiter)] if cut >= 0 else ""
        if common and out.prefixes and out.prefixes[-1] == common:
            continue
        if len(out.uploads) + len(out.prefixes) >= query.max_uploads:
            out.truncated = True
            break
        if common:
            out.prefixes.append(common)
            out.next_key, out.next_id = common, ""
        else:
            out.uploads.append(upload)
            out.next_key, out.next_id = upload.key, upload.id
    return out


def owner_nodes(req: S3Request, parent: ET.Element) -> None:
    """Initiator and Owner: the caller's account (uploads are per account)."""
    for tag in ("Initiator", "Owner"):
        el = node(parent, tag)
        node(el, "ID", req.store.account_id)
        node(el, "DisplayName", req.store.account_id)


def _query(req: S3Request) -> Query:
    text = req.query.get("max-uploads", "")
    if text and not (text.isascii() and text.isdigit() and len(text) <= 10):
        raise S3Error("InvalidArgument", "max-uploads must be an integer between 0 and "
                      "2147483647", req.resource)
    return Query(req.query.get("prefix", ""), req.query.get("delimiter", ""),
                 req.query.get("key-marker", ""), req.query.get("upload-id-marker", ""),
                 min(int(text), MAX_UPLOADS) if text else MAX_UPLOADS)


async def list_uploads(req: S3Request) -> Reply:
    query = _query(req)
    await require_bucket(req)
    await run(req.store.check_read, req.bucket)
    result = page(await run(uploads.of_bucket, req), query)
    encode = req.query.get("encoding-type") == "url"

    def text(value: str) -> str:
        return quote(value, safe="/") if encode else value

    out = root("ListMultipartUploadsResult")
    node(out, "Bucket", req.bucket)
    node(out, "KeyMarker", text(query.key_marker))
    node(out, "UploadIdMarker", query.id_marker)
    if result.truncated:
        node(out, "NextKeyMarker", text(result.next_key))
        node(out, "NextUploadIdMarker", result.next_id)
    node(out, "Prefix", text(query.prefix))
    if query.delimiter:
        node(out, "Delimiter", text(query.delimiter))
    node(out, "MaxUploads", query.max_uploads)
    node(out, "IsTruncated", "true" if result.truncated else "false")
    if encode:
        node(out, "EncodingType", "url")
    for upload in result.uploads:
        el = node(out, "Upload")
        node(el, "UploadId", upload.id)
        node(el, "Key", text(upload.key))
        node(el, "Initiated", iso_time(upload.initiated))
        node(el, "StorageClass", "STANDARD")
        owner_nodes(req, el)
    for prefix in result.prefixes:
        node(node(out, "CommonPrefixes"), "Prefix", text(prefix))
    return xml_reply(out)
