"""AWS Signature Version 4 verification for incoming requests.

The canonical request and string-to-sign are computed with botocore's own signer, so the
server agrees with every AWS SDK bit for bit; only the comparison is ours.

Signed for service `s3` (api/s3), a request is checked as S3 checks it: the path is taken as
received, never normalised or encoded again; the payload hash is the signed
`x-amz-content-sha256` header's value (the body is checked against it as it is read, or it
names a streaming or unsigned payload); a presigned URL carries its signature in the query
(`check_query`); the chunks of a signed aws-chunked body are checked with
`chunk_signature`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from starlette.datastructures import URL
from starlette.types import Scope

from eaglenest.foundation.errors import (
    InvalidSignatureException,
    UnrecognizedClientException,
)

SERVICE = "sagemaker"
_AUTH_RE = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<cred>[^,\s]+),\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+),\s*Signature=(?P<sig>[0-9a-f]{64})\s*$"
)


@dataclass(frozen=True)
class SignedRequest:
    """A request as its signature is checked: the one record of the signed edge, built by
    every plane with `of` (api.edge.bounded.read_signed reads its body, then checks it)."""

    method: str
    url: str  # scheme://host/path?query as received (module docstring: S3's path)
    headers: Mapping[str, str]  # lower-cased names
    body: bytes = b""  # S3 signs its payload's hash in x-amz-content-sha256 instead

    @classmethod
    def of(cls, scope: Scope, path_as_sent: bool = False) -> SignedRequest:
        """The request of an ASGI `scope` (its body not read yet). The path is the decoded
        one, as botocore normalises it for the JSON and runtime planes; `path_as_sent`: the
        raw path, as S3 signs it."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope["headers"]}
        if not path_as_sent:
            return cls(scope["method"], str(URL(scope=scope)), headers)
        raw = scope.get("raw_path") or str(scope.get("path", "/")).encode()
        path = raw.decode("latin-1") if isinstance(raw, bytes) else str(raw)
        query = scope.get("query_string", b"")
        qs = query.decode("latin-1") if isinstance(query, bytes) else ""
        url = f"{scope.get('scheme', 'http')}://{headers.get('host', '')}{path}"
        return cls(scope["method"], f"{url}?{qs}" if qs else url, headers)


@dataclass(frozen=True)
class Verified:
    access_key: str
    region: str


#: headers every request must sign, and those the JSON protocol adds (its operation and
#: body type: unsigned, a captured request could be re-aimed at another operation)
REQUIRED = ("host", "x-amz-date")
REQUIRED_JSON = (*REQUIRED, "x-amz-target", "content-type")
#: how AWS spells each in "'<Name>' must be a 'SignedHeader' in the AWS Authorization."
_SPELLING = {"host": "Host", "x-amz-date": "X-Amz-Date", "x-amz-target": "X-Amz-Target",
             "content-type": "Content-Type"}


@dataclass(frozen=True)
class Claim:
    """What the Authorization header claims, checked as far as it can be without the body."""

    access_key: str
    secret: str
    region: str
    amz_date: str
    signed: list[str]
    signature: str
    service: str
    presigned: bool = False  # the signature came in the query (check_query)


#: the longest a presigned URL may be valid (S3's: seven days)
MAX_EXPIRES = 7 * 24 * 3600


def _scope(cred: str, secrets: Mapping[str, str], region: str,
           service: str) -> tuple[str, str, str]:
    """(access key, secret, scope date) of a credential scope `key/date/region/service/
    aws4_request` of a known key for this region and `service`."""
    scope = cred.split("/")
    if len(scope) != 5 or scope[4] != "aws4_request":
        raise InvalidSignatureException(f"Credential scope '{cred}' is malformed.")
    access_key, date, cred_region = scope[:3]
    secret = secrets.get(access_key)
    if secret is None:
        raise UnrecognizedClientException("The security token included in the request is invalid.")
    if scope[3] != service:
        raise InvalidSignatureException(
            f"Credential should be scoped to correct service: '{service}'."
        )
    if cred_region != region:
        raise InvalidSignatureException(
            f"Credential should be scoped to a valid region: this service runs in '{region}', "
            f"the request was signed for '{cred_region}'."
        )
    return access_key, secret, date


def check_header(headers: Mapping[str, str], secrets: Mapping[str, str], region: str,
                 max_skew: int, service: str = SERVICE,
                 required: tuple[str, ...] = REQUIRED) -> Claim:
    """Everything but the signature itself: a present, well-formed Authorization of a known
    key, scoped to this region and `service` (the SigV4 signing name: sagemaker, or tagging
    for the Resource Groups Tagging API), dated within `max_skew`, signing every header of
    `required`. Run before the body is read: an unsigned request costs no body."""
    auth = headers.get("authorization")
    if not auth:
        raise InvalidSignatureException(
            "Request is missing Authentication Token: sign it with AWS Signature Version 4 "
            f"(service '{service}')."
        )
    m = _AUTH_RE.match(auth)
    if m is None:
        raise InvalidSignatureException(
            "Authorization header is not a valid AWS4-HMAC-SHA256 signature "
            "(expected Credential=..., SignedHeaders=..., Signature=...)."
        )
    access_key, secret, date = _scope(m["cred"], secrets, region, service)
    signed = m["signed"].split(";")
    _check_signed(signed, headers, required)
    amz_date = _check_date(headers, date, max_skew)
    return Claim(access_key, secret, region, amz_date, signed, m["sig"], service)


def _check_signed(signed: list[str], headers: Mapping[str, str],
                  required: tuple[str, ...]) -> None:
    for name in required:
        if name not in signed:
            raise InvalidSignatureException(
                f"'{_SPELLING.get(name, name)}' must be a 'SignedHeader' in the AWS "
                "Authorization.")
    for name in signed:
        if name not in headers:
            raise InvalidSignatureException(f"Signed header '{name}' is missing from the request.")


def check_query(query: Mapping[str, str], headers: Mapping[str, str],
                secrets: Mapping[str, str], region: str, max_skew: int,
                service: str) -> Claim:
    """A presigned URL's claim (its X-Amz-* query parameters), as `check_header` checks a
    header's; valid from X-Amz-Date (less `max_skew`) for X-Amz-Expires seconds (at most
    seven days). The payload is unsigned."""
    if query.get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256":
        raise InvalidSignatureException("X-Amz-Algorithm must be AWS4-HMAC-SHA256.")
    signature = query.get("X-Amz-Signature", "")
    if re.fullmatch(r"[0-9a-f]{64}", signature) is None:
        raise InvalidSignatureException("X-Amz-Signature is missing or malformed.")
    access_key, secret, date = _scope(query.get("X-Amz-Credential", ""), secrets, region,
                                      service)
    amz_date = query.get("X-Amz-Date", "")
    try:
        signed_at = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
        expires = int(query.get("X-Amz-Expires", ""))
    except ValueError as exc:
        raise InvalidSignatureException("X-Amz-Date or X-Amz-Expires is malformed.") from exc
    if not amz_date.startswith(date) or not 0 < expires <= MAX_EXPIRES:
        raise InvalidSignatureException(
            f"X-Amz-Expires must be 1 to {MAX_EXPIRES} seconds and X-Amz-Date match the "
            "credential's date.")
    now = datetime.now(UTC)
    if now < signed_at - timedelta(seconds=max_skew) or \
            now > signed_at + timedelta(seconds=expires):
        raise InvalidSignatureException("Request has expired")
    signed = query.get("X-Amz-SignedHeaders", "").split(";")
    _check_signed(signed, headers, ("host",))
    return Claim(access_key, secret, region, amz_date, signed, signature, service, True)


def chunk_signature(claim: Claim, previous: str, chunk_sha256: str) -> str:
    """The signature of one chunk (given as its hex SHA-256) of a
    STREAMING-AWS4-HMAC-SHA256-PAYLOAD body, chained to the previous chunk's (the first:
    the request's own signature)."""
    signer = SigV4Auth(Credentials(claim.access_key, claim.secret), claim.service,
                       claim.region)
    req = AWSRequest(method="PUT", url="http://chunk/")
    req.context["timestamp"] = claim.amz_date
    text = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", claim.amz_date,
                      signer.credential_scope(req), previous,
                      hashlib.sha256(b"").hexdigest(), chunk_sha256])
    return str(signer.signature(text, req))


def check_signature(req: SignedRequest, claim: Claim) -> Verified:
    """The signature of `req` (body included) is the one `claim` carries."""
    expected = _signature(req, claim)
    if not hmac.compare_digest(expected, claim.signature):
        raise InvalidSignatureException(
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method."
        )
    return Verified(access_key=claim.access_key, region=claim.region)


def verify(
    req: SignedRequest, secrets: Mapping[str, str], region: str, max_skew: int,
    service: str = SERVICE, required: tuple[str, ...] = REQUIRED,
) -> Verified:
    """Raise an AWS auth error unless `req` carries a valid SigV4 signature for `service`."""
    claim = check_header(req.headers, secrets, region, max_skew, service, required)
    return check_signature(req, claim)


def _check_date(headers: Mapping[str, str], scope_date: str, max_skew: int) -> str:
    amz_date = headers.get("x-amz-date", "")
    try:
        signed_at = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError as exc:
        raise InvalidSignatureException(
            "X-Amz-Date header is missing or not in the form YYYYMMDD'T'HHMMSS'Z'."
        ) from exc
    if not amz_date.startswith(scope_date):
        raise InvalidSignatureException("Credential scope date does not match X-Amz-Date.")
    skew = abs((datetime.now(UTC) - signed_at).total_seconds())
    if skew > max_skew:
        raise InvalidSignatureException(
            f"Signature expired: {amz_date} is more than {max_skew // 60} minutes from the "
            f"server time {datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}."
        )
    return amz_date


def _signer(claim: Claim) -> SigV4Auth:
    """botocore's signer for the claim: S3's keeps the path as received (and a presigned
    URL's payload is UNSIGNED-PAYLOAD)."""
    creds = Credentials(claim.access_key, claim.secret)
    if claim.service != "s3":
        return SigV4Auth(creds, claim.service, claim.region)
    if claim.presigned:
        return S3SigV4QueryAuth(creds, claim.service, claim.region)
    return S3SigV4Auth(creds, claim.service, claim.region)


def _unsigned_url(url: str) -> str:
    """`url` without its X-Amz-Signature query parameter (what a presigned URL signs)."""
    base, _, query = url.partition("?")
    kept = [p for p in query.split("&") if p and not p.startswith("X-Amz-Signature=")]
    return f"{base}?{'&'.join(kept)}" if kept else base


def _signature(req: SignedRequest, claim: Claim) -> str:
    headers = {name: req.headers[name] for name in claim.signed}
    url = _unsigned_url(req.url) if claim.presigned else req.url
    aws_req = AWSRequest(method=req.method, url=url, headers=headers, data=req.body)
    aws_req.context["timestamp"] = claim.amz_date
    signer = _signer(claim)
    canonical = signer.canonical_request(aws_req)
    string_to_sign = signer.string_to_sign(aws_req, canonical)
    return str(signer.signature(string_to_sign, aws_req))
