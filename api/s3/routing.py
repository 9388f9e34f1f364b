"""Which requests are S3's, who signed them, and which operation they ask for.

A request belongs to the S3 API when its SigV4 credential scope (the Authorization header's
`Credential=`, or a presigned URL's X-Amz-Credential) names the service `s3`, whatever its
path: `/endpoints/...` is then a bucket named `endpoints`. An unsigned request belongs to it
too unless it is one of the API's own routes (`POST /`, `/ping`, `/metrics`,
`/endpoints/...`, `/console...`, CloudWatch's `/service/GraniteServiceVersion20100801/...`):
it is refused with S3's AccessDenied."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import parse_qsl, unquote

from eaglenest.api.edge.sigv4 import (
    Claim,
    SignedRequest,
    check_header,
    check_query,
    check_signature,
)
from eaglenest.api.s3 import bucket_ops, listing, multipart, objects
from eaglenest.api.s3.errors import S3Error
from eaglenest.api.s3.request import Reply, S3Request
from eaglenest.foundation.settings import Settings

SERVICE = "s3"
REQUIRED = ("host", "x-amz-date", "x-amz-content-sha256")
_SCOPE = re.compile(r"Credential=[^/,\s]*/\d{8}/[^/,\s]*/([^/,\s]+)/aws4_request")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_OWN_ROUTES = ("/ping", "/metrics")
_OWN_PREFIXES = ("/endpoints/", "/console/", "/service/GraniteServiceVersion20100801/")
#: bucket subresources this API does not keep (a request naming one is NotImplemented)
_UNSUPPORTED = ("acl", "policy", "versioning", "tagging", "cors", "lifecycle", "website",
                "logging", "notification", "replication", "encryption", "object-lock",
                "ownershipControls", "publicAccessBlock", "accelerate", "requestPayment",
                "uploads", "versions", "retention", "legal-hold", "torrent", "restore",
                "select", "attributes", "analytics", "metrics", "inventory",
                "intelligent-tiering")
Handler = Callable[[S3Request], Awaitable[Reply]]


def query_of(scope: Mapping[str, object]) -> dict[str, str]:
    raw = scope.get("query_string", b"")
    text = raw.decode("latin-1") if isinstance(raw, bytes) else ""
    return dict(parse_qsl(text, keep_blank_values=True))


def is_s3(scope: Mapping[str, object], headers: Mapping[str, str],
          query: Mapping[str, str]) -> bool:
    """Whether the request is the S3 API's (module docstring)."""
    auth = headers.get("authorization")
    credential = query.get("X-Amz-Credential")
    if auth is not None:
        m = _SCOPE.search(auth)
        return m is not None and m[1] == SERVICE
    if credential is not None:
        return credential.endswith(f"/{SERVICE}/aws4_request")
    path, method = str(scope.get("path", "")), scope.get("method")
    return not ((method == "POST" and path == "/") or path in _OWN_ROUTES
                or path.startswith(_OWN_PREFIXES) or path == "/console")


def authenticate(req: SignedRequest, query: Mapping[str, str], secrets: Mapping[str, str],
                 settings: Settings) -> Claim:
    """The verified claim of the request (header or presigned); the payload's hash is the
    signed x-amz-content-sha256, checked against the body as it is read (api/s3/body.py)."""
    headers = req.headers
    if "authorization" not in headers and "X-Amz-Credential" not in query:
        raise S3Error("AccessDenied", "Access Denied: the request is not signed (sign it "
                      "with AWS Signature Version 4, service 's3').")
    if "authorization" in headers:
        claim = check_header(headers, secrets, settings.region, settings.signature_max_skew,
                             SERVICE, REQUIRED)
    else:
        claim = check_query(query, headers, secrets, settings.region,
                            settings.signature_max_skew, SERVICE)
    check_signature(req, claim)
    return claim


def split_path(scope: Mapping[str, object]) -> tuple[str, str]:
    """(bucket, key) of a path-style request; the key percent-decoded (a %2F is a '/').
    InvalidBucketName for a bucket S3 would not name (so no '.'-led name: never the store's
    own records)."""
    raw = scope.get("raw_path") or str(scope.get("path", "/")).encode()
    path = raw.decode("latin-1") if isinstance(raw, bytes) else str(raw)
    bucket, _, key = path.lstrip("/").partition("/")
    bucket = unquote(bucket)
    if bucket and _BUCKET.match(bucket) is None:
        raise S3Error("InvalidBucketName", "The specified bucket is not valid.", "/" + bucket)
    return bucket, unquote(key, errors="strict")


def _bucket_handler(method: str, query: Mapping[str, str]) -> Handler | None:
    if method == "GET" and "location" in query:
        return bucket_ops.bucket_location
    if method == "POST" and "delete" in query:
        return objects.delete_objects
    if method == "GET" and "uploads" in query:
        return multipart.list_uploads
    if any(name in query for name in _UNSUPPORTED):
        return None
    if method == "GET":
        return listing.list_objects_v2 if query.get("list-type") == "2" \
            else listing.list_objects_v1
    return {"HEAD": bucket_ops.head_bucket, "PUT": bucket_ops.create_bucket,
            "DELETE": bucket_ops.delete_bucket}.get(method)


def _object_handler(method: str, query: Mapping[str, str]) -> Handler | None:
    if "uploadId" in query:
        return {"PUT": multipart.upload_part, "POST": multipart.complete_upload,
                "DELETE": multipart.abort_upload, "GET": multipart.list_parts}.get(method)
    if method == "POST" and "uploads" in query:
        return multipart.create_upload
    if any(name in query for name in _UNSUPPORTED):
        return None
    return {"PUT": objects.put_object, "GET": objects.get_object,
            "HEAD": objects.head_object, "DELETE": objects.delete_object}.get(method)


def handler(method: str, bucket: str, key: str, query: Mapping[str, str],
            resource: str) -> Handler:
    """The operation's handler; NotImplemented (or MethodNotAllowed) for any other."""
    if not bucket:
        found: Handler | None = bucket_ops.list_buckets if method == "GET" else None
    elif not key:
        found = _bucket_handler(method, query)
    else:
        found = _object_handler(method, query)
    if found is None:
        raise S3Error("NotImplemented", f"{method} {resource} with "
                      f"{sorted(query) or 'no query'}: this operation is not supported by "
                      "EagleNest's S3 API (docs/s3-api.md).", resource)
    return found
