"""S3's errors: `<Error><Code>..</Code><Message>..</Message><Resource>..</Resource>
<RequestId>..</RequestId></Error>` with the HTTP status S3 gives each code (botocore reads
the code from the XML, and from the status alone for a HEAD, which has no body).

`from_storage` and `from_auth` translate the store's and SigV4's failures into S3's codes."""

from __future__ import annotations

from xml.sax.saxutils import escape

from eaglenest.foundation.errors import (
    InvalidSignatureException,
    ServiceError,
    UnrecognizedClientException,
)
from eaglenest.foundation.store.buckets import AccessDenied, TooManyBuckets
from eaglenest.foundation.store.disk_usage import StoredBytesExceeded
from eaglenest.foundation.store.storage import (
    BucketNotEmpty,
    KeyTooLong,
    NoSuchBucket,
    StorageError,
)

#: code -> HTTP status, as S3 answers each
STATUS = {
    "AccessDenied": 403, "SignatureDoesNotMatch": 403, "InvalidAccessKeyId": 403,
    "RequestTimeTooSkewed": 403, "NoSuchBucket": 404, "NoSuchKey": 404, "NoSuchUpload": 404,
    "BucketNotEmpty": 409, "BucketAlreadyExists": 409, "BucketAlreadyOwnedByYou": 409,
    "InvalidRange": 416, "InvalidArgument": 400, "InvalidBucketName": 400,
    "MalformedXML": 400, "InvalidPart": 400, "InvalidPartOrder": 400, "EntityTooSmall": 400,
    "EntityTooLarge": 400, "BadDigest": 400, "XAmzContentSHA256Mismatch": 400,
    "IncompleteBody": 400, "InvalidRequest": 400, "KeyTooLongError": 400,
    "QuotaExceeded": 403, "MethodNotAllowed": 405, "NotImplemented": 501,
    "InternalError": 500, "AuthorizationHeaderMalformed": 400, "TooManyBuckets": 400,
}


class S3Error(ServiceError):
    """One S3 error reply; `resource` is the bucket or key path it concerns."""

    def __init__(self, code: str, message: str, resource: str = "") -> None:
        super().__init__(message)
        self.code, self.status, self.resource = code, STATUS.get(code, 400), resource
        self.headers: dict[str, str] = {}  # sent with the error (InvalidRange's range)

    def xml(self, request_id: str) -> bytes:
        return ('<?xml version="1.0" encoding="UTF-8"?>\n<Error>'
                f"<Code>{self.code}</Code><Message>{escape(self.message)}</Message>"
                f"<Resource>{escape(self.resource)}</Resource>"
                f"<RequestId>{request_id}</RequestId></Error>").encode()


def from_auth(exc: ServiceError, resource: str) -> S3Error:
    """S3's code for a SigV4 failure (api/edge/sigv4.py raises the JSON protocols' codes)."""
    if isinstance(exc, UnrecognizedClientException):
        return S3Error("InvalidAccessKeyId", "The AWS Access Key Id you provided does not "
                       "exist in our records.", resource)
    if isinstance(exc, InvalidSignatureException) and "does not match" in exc.message:
        return S3Error("SignatureDoesNotMatch", exc.message, resource)
    if isinstance(exc, InvalidSignatureException) and "expired" in exc.message.lower():
        return S3Error("AccessDenied", exc.message, resource)
    if isinstance(exc, S3Error):
        exc.resource = exc.resource or resource
        return exc
    return S3Error("AccessDenied", exc.message, resource)


def from_storage(exc: StorageError, resource: str) -> S3Error:
    """S3's code for a store failure: another account's bucket (AccessDenied), the quota
    (QuotaExceeded), a missing object (NoSuchKey) or bucket, a bucket not empty, a key the
    store cannot hold (KeyTooLongError), the bucket limit, a refused key."""
    text = str(exc)
    if isinstance(exc, NoSuchBucket):
        return no_such_bucket(exc.bucket)
    if isinstance(exc, KeyTooLong):
        return S3Error("KeyTooLongError", f"Your key is too long: {text}", resource)
    if isinstance(exc, TooManyBuckets):
        return S3Error("TooManyBuckets", text, resource)
    if isinstance(exc, AccessDenied):
        return S3Error("AccessDenied", "Access Denied: " + text.removeprefix("AccessDenied: "),
                       resource)
    if isinstance(exc, StoredBytesExceeded):
        return S3Error("QuotaExceeded", text, resource)
    if isinstance(exc, BucketNotEmpty):
        return S3Error("BucketNotEmpty", "The bucket you tried to delete is not empty",
                       resource)
    if text.endswith("does not exist"):
        return S3Error("NoSuchKey", "The specified key does not exist.", resource)
    return S3Error("InvalidArgument", text, resource)


def no_such_bucket(bucket: str) -> S3Error:
    return S3Error("NoSuchBucket", "The specified bucket does not exist", bucket)


def no_such_key(resource: str) -> S3Error:
    return S3Error("NoSuchKey", "The specified key does not exist.", resource)
