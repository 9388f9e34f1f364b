"""AWS Signature Version 4 verification for incoming requests.

The canonical request and string-to-sign are computed with botocore's own signer, so the
server agrees with every AWS SDK bit for bit; only the comparison is ours.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

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
class IncomingRequest:
    method: str
    url: str  # scheme://host/path?query exactly as received
    headers: Mapping[str, str]  # lower-cased names
    body: bytes


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
    scope = m["cred"].split("/")
    if len(scope) != 5 or scope[4] != "aws4_request":
        raise InvalidSignatureException(f"Credential scope '{m['cred']}' is malformed.")
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
    signed = m["signed"].split(";")
    for name in required:
        if name not in signed:
            raise InvalidSignatureException(
                f"'{_SPELLING.get(name, name)}' must be a 'SignedHeader' in the AWS "
                "Authorization.")
    for name in signed:
        if name not in headers:
            raise InvalidSignatureException(f"Signed header '{name}' is missing from the request.")
    amz_date = _check_date(headers, date, max_skew)
    return Claim(access_key, secret, cred_region, amz_date, signed, m["sig"], service)


def check_signature(req: IncomingRequest, claim: Claim) -> Verified:
    """The signature of `req` (body included) is the one `claim` carries."""
    expected = _signature(req, claim)
    if not hmac.compare_digest(expected, claim.signature):
        raise InvalidSignatureException(
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method."
        )
    return Verified(access_key=claim.access_key, region=claim.region)


def verify(
    req: IncomingRequest, secrets: Mapping[str, str], region: str, max_skew: int,
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


def _signature(req: IncomingRequest, claim: Claim) -> str:
    headers = {name: req.headers[name] for name in claim.signed}
    aws_req = AWSRequest(method=req.method, url=req.url, headers=headers, data=req.body)
    aws_req.context["timestamp"] = claim.amz_date
    signer = SigV4Auth(Credentials(claim.access_key, claim.secret), claim.service, claim.region)
    canonical = signer.canonical_request(aws_req)
    string_to_sign = signer.string_to_sign(aws_req, canonical)
    return str(signer.signature(string_to_sign, aws_req))
