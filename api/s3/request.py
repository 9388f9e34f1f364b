"""One S3 request as the handlers see it (`S3Request`: bucket, key, query, the caller's view
of the store) and what they answer (`Reply`), with the XML helpers of S3's replies."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import formatdate
from pathlib import Path
from typing import BinaryIO

from starlette.types import Receive

from eaglenest.api.edge.sigv4 import Claim
from eaglenest.api.s3.errors import S3Error
from eaglenest.foundation.settings import Settings
from eaglenest.foundation.store.buckets import AccountStore
from eaglenest.foundation.store.storage import S3Uri, StorageError, parse_uri

NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"
#: S3's longest key, in UTF-8 bytes
MAX_KEY_BYTES = 1024


@dataclass
class S3Request:
    method: str
    bucket: str  # "" for the service itself (ListBuckets)
    key: str  # "" for a bucket's own operations; decoded (a %2F is a '/')
    query: dict[str, str]
    headers: dict[str, str]  # lower-cased names
    claim: Claim
    store: AccountStore  # the caller's account's view: every access goes through it
    receive: Receive
    settings: Settings

    @property
    def resource(self) -> str:
        return f"/{self.bucket}/{self.key}" if self.key else f"/{self.bucket}"

    @property
    def staging(self) -> Path:
        """Where bodies are written before they become objects (data dir, outside the
        store: never a bucket or key)."""
        return self.settings.data_dir / "s3-uploads"

    def uri(self) -> S3Uri:
        """The object's URI, checked as every store URI is (foundation/store/storage.py
        parse_uri: no '.', '..', empty segment, '\\', control character, reserved prefix);
        InvalidArgument otherwise, KeyTooLongError past S3's 1024 bytes. A key ending in
        '/' is refused as well (the local store keeps no object at a folder's name)."""
        if len(self.key.encode()) > MAX_KEY_BYTES:
            raise S3Error("KeyTooLongError", "Your key is too long", self.resource)
        try:
            uri = parse_uri(f"s3://{self.bucket}/{self.key}")
        except StorageError as exc:
            raise S3Error("InvalidArgument", str(exc), self.resource) from exc
        if uri.key.endswith("/"):
            raise S3Error("InvalidArgument", f"'{uri}': this store keeps no key ending in '/'",
                          self.resource)
        return uri


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    stream: BinaryIO | None = None  # sent after `body`, `length` bytes, then closed
    length: int = 0


def iso_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def http_time(ts: float) -> str:
    return formatdate(ts, usegmt=True)


def node(parent: ET.Element, tag: str, text: str | int | None = None) -> ET.Element:
    child = ET.SubElement(parent, tag)
    if text is not None:
        child.text = str(text)
    return child


def root(tag: str) -> ET.Element:
    return ET.Element(tag, xmlns=NAMESPACE)


def xml_reply(element: ET.Element, status: int = 200) -> Reply:
    body = b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(element)
    return Reply(status, body, {"content-type": "application/xml"})


def parse_xml(body: bytes, resource: str) -> ET.Element:
    """A request's XML with namespaces dropped from the tags; MalformedXML otherwise. (The
    body is capped before: api/s3/body.py read_small.)"""
    try:
        doc = ET.fromstring(body)
    except ET.ParseError as exc:
        raise S3Error("MalformedXML", "The XML you provided was not well-formed or did not "
                      "validate against our published schema", resource) from exc
    for el in doc.iter():
        el.tag = el.tag.rpartition("}")[2]
    return doc
