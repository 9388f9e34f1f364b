"""Create requests name only buckets the caller may use; only what EagleNest will write
claims a bucket.

Every `s3://` URI anywhere in a Create request (model data, job inputs and outputs, Data
Capture and async-inference destinations, environment values) is checked before the row is
written: a bucket another account owns is a ValidationException, nothing created. A bucket
no account owns may be named:
- as a location EagleNest writes (`WRITES`: a job's `OutputConfig.S3OutputLocation`, Data
  Capture's `DataCaptureConfig.DestinationS3Uri`) by any account: once the row is inserted,
  it is claimed for the caller, in the same transaction's lifetime (a claim lost to a
  racing account also refuses the request: the row is rolled back; claims are not undone if
  the transaction later fails), so that the writes to come cannot be refused;
- anywhere else (read, or stored and never used by EagleNest) only by the store's default
  account (the operator's, `BucketStore.default_account`), or for a bucket this request
  claims as a write location; it claims nothing. Any other account is refused, the message
  saying the bucket has no owner and how an operator assigns one (`eaglenest s3 owner`).

Model data (ModelDataUrl, ModelDataSource, AdditionalModelDataSources, an optimization job's
ModelSource.S3) in another account's bucket is refused with SageMaker's CreateModel text for
model data it cannot read; any other refusal is a ValidationException naming the member.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from eaglenest.foundation.accounts import Account
from eaglenest.foundation.errors import ValidationException
from eaglenest.foundation.store.buckets import unowned_reason
from eaglenest.foundation.store.storage import BucketStore, StorageError

_BUCKET = re.compile(r"^s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/|$)")
#: the members whose location EagleNest writes (a job's outputs, Data Capture's files)
WRITES = frozenset({"OutputConfig.S3OutputLocation", "DataCaptureConfig.DestinationS3Uri"})


@dataclass(frozen=True)
class Reference:
    """One `s3://` URI of a request: the member holding it (`A.B.1.C`) and its bucket."""

    member: str
    uri: str
    bucket: str

    @property
    def write(self) -> bool:
        """Whether EagleNest writes at this location (and so claims its bucket)."""
        return self.member in WRITES


def references(spec: Any, at: str = "") -> list[Reference]:
    """Every `s3://` URI in `spec` with a well-formed bucket name, in request order."""
    if isinstance(spec, dict):
        return [r for k, v in spec.items() for r in references(v, f"{at}.{k}" if at else k)]
    if isinstance(spec, list):
        return [r for i, v in enumerate(spec, start=1) for r in references(v, f"{at}.{i}")]
    if isinstance(spec, str):
        m = _BUCKET.match(spec)
        if m:
            return [Reference(at, spec, m[1])]
    return []


def denied(ref: Reference, spec: dict[str, Any], account: Account,
           why: str | None = None) -> ValidationException:
    """The error for a URI the caller may not use (`why`: a store failure instead of
    another account's bucket)."""
    if "ModelData" in ref.member or ref.member.startswith("ModelSource."):
        role = spec.get("ExecutionRoleArn") or spec.get("RoleArn") or ""
        return ValidationException(
            f"Could not access model data at {ref.uri}. Please ensure that the role "
            f'"{role}" exists and that its trust relationship policy allows the action '
            '"sts:AssumeRole" for the service principal "sagemaker.amazonaws.com". Also '
            'ensure that the role has "s3:GetObject" permissions and that the object is '
            f"located in {account.region}. If your Model uses multiple models or "
            'uncompressed models, please ensure that the role has "s3:ListBucket" '
            "permission.")
    return ValidationException(
        f"{ref.member}: Access Denied to {ref.uri}: "
        + (why or f"the bucket '{ref.bucket}' belongs to another account."))


def check(store: BucketStore, account: Account, spec: dict[str, Any]) -> list[Reference]:
    """The request's references; ValidationException for the first one in a bucket another
    account owns, or outside `WRITES` in a bucket no account owns unless the caller is the
    store's default account or the request writes into that bucket too. Writes nothing."""
    refs = references(spec)
    written = {ref.bucket for ref in refs if ref.write}
    for ref in refs:
        owner = store.owner(ref.bucket)
        if owner is None:
            if ref.bucket not in written and account.account_id != store.default_account:
                raise ValidationException(
                    f"{ref.member}: Access Denied to {ref.uri}: "
                    + unowned_reason(ref.bucket, account.account_id) + ".")
        elif owner != account.account_id:
            raise denied(ref, spec, account)
    return refs


def claim(store: BucketStore, account: Account, spec: dict[str, Any],
          refs: list[Reference]) -> None:
    """Claim each written (`WRITES`) bucket no account owns for `account`; other references
    claim nothing. ValidationException if another account's claim won the race (or the
    store cannot record the claim)."""
    for ref in (r for r in refs if r.write):
        try:
            owner = store.claim(ref.bucket, account.account_id)
        except StorageError as exc:
            raise denied(ref, spec, account, str(exc)) from exc
        if owner != account.account_id:
            raise denied(ref, spec, account)
