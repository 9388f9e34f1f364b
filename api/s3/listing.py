"""ListObjectsV2 and ListObjects (v1): prefix, delimiter (CommonPrefixes), max-keys,
continuation token / marker, start-after, `encoding-type=url`.

The listing is computed from the sorted keys under the prefix (one store listing per
page); a continuation token holds the last key or common prefix of the page before
(foundation/page_tokens.py), so a page resumes after it however the bucket changed
meanwhile."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from urllib.parse import quote

from eaglenest.api.s3.errors import S3Error
from eaglenest.api.s3.request import Reply, S3Request, iso_time, node, root, xml_reply
from eaglenest.api.s3.store_access import require_bucket, run
from eaglenest.foundation import page_tokens
from eaglenest.foundation.store.storage import ObjectInfo, S3Uri

MAX_KEYS = 1000


@dataclass
class Page:
    contents: list[ObjectInfo] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    truncated: bool = False
    last: str = ""  # the last key or common prefix on the page


def page(objects: list[ObjectInfo], prefix: str, delimiter: str, after: str,
         max_keys: int) -> Page:
    """One page of the sorted `objects` under `prefix`, those after `after` (a key, or a
    common prefix, whose keys are all skipped)."""
    out = Page()
    for info in objects:
        key = info.key
        if not key.startswith(prefix) or key <= after or (
                delimiter and after.endswith(delimiter) and key.startswith(after)):
            continue
        cut = key.find(delimiter, len(prefix)) if delimiter else -1
        item = key[:cut + len(delimiter)] if cut >= 0 else key
        if out.prefixes and item == out.prefixes[-1]:
            continue
        if len(out.contents) + len(out.prefixes) >= max_keys:
            out.truncated = True
            break
        if cut >= 0:
            out.prefixes.append(item)
        else:
            out.contents.append(info)
        out.last = item
    return out


def _max_keys(req: S3Request) -> int:
    try:
        n = int(req.query.get("max-keys", MAX_KEYS))
    except ValueError as exc:
        raise S3Error("InvalidArgument", "max-keys must be an integer", req.resource) from exc
    if n < 0:
        raise S3Error("InvalidArgument", "max-keys must be 0 or more", req.resource)
    return min(n, MAX_KEYS)


def _token(req: S3Request) -> str:
    token = req.query.get("continuation-token")
    if token is None:
        return req.query.get("start-after", "")
    try:
        after: str = page_tokens.decode(token, valid=lambda c: isinstance(c, str))
    except page_tokens.MalformedToken as exc:
        raise S3Error("InvalidArgument", "The continuation token provided is incorrect",
                      req.resource) from exc
    return after


def _fill(req: S3Request, out: ET.Element, result: Page) -> None:
    encode = req.query.get("encoding-type") == "url"

    def text(value: str) -> str:
        return quote(value, safe="/") if encode else value

    for info in result.contents:
        el = node(out, "Contents")
        node(el, "Key", text(info.key))
        node(el, "LastModified", iso_time(info.mtime))
        node(el, "ETag", info.etag)
        node(el, "Size", info.size)
        node(el, "StorageClass", "STANDARD")
    for prefix in result.prefixes:
        node(node(out, "CommonPrefixes"), "Prefix", text(prefix))


async def _page(req: S3Request, after: str) -> tuple[Page, int]:
    await require_bucket(req)
    prefix = req.query.get("prefix", "")
    max_keys = _max_keys(req)
    objects = await run(req.store.list_objects, S3Uri(req.bucket, prefix))
    return page(objects, prefix, req.query.get("delimiter", ""), after, max_keys), max_keys


def _head(req: S3Request, out: ET.Element, max_keys: int, result: Page) -> None:
    encode = req.query.get("encoding-type") == "url"
    node(out, "Name", req.bucket)
    for name in ("prefix", "delimiter"):
        value = req.query.get(name, "")
        if value or name == "prefix":
            node(out, name.capitalize(), quote(value, safe="/") if encode else value)
    node(out, "MaxKeys", max_keys)
    if encode:
        node(out, "EncodingType", "url")
    node(out, "IsTruncated", "true" if result.truncated else "false")


async def list_objects_v2(req: S3Request) -> Reply:
    result, max_keys = await _page(req, _token(req))
    out = root("ListBucketResult")
    _head(req, out, max_keys, result)
    node(out, "KeyCount", len(result.contents) + len(result.prefixes))
    if "continuation-token" in req.query:
        node(out, "ContinuationToken", req.query["continuation-token"])
    if "start-after" in req.query:
        node(out, "StartAfter", req.query["start-after"])
    if result.truncated:
        node(out, "NextContinuationToken", page_tokens.encode(result.last))
    _fill(req, out, result)
    return xml_reply(out)


async def list_objects_v1(req: S3Request) -> Reply:
    marker = req.query.get("marker", "")
    result, max_keys = await _page(req, marker)
    out = root("ListBucketResult")
    _head(req, out, max_keys, result)
    node(out, "Marker", marker)
    if result.truncated and req.query.get("delimiter"):
        node(out, "NextMarker", result.last)
    _fill(req, out, result)
    return xml_reply(out)
