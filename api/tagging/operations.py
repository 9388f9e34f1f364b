"""The Resource Groups Tagging API for our resources, on the same endpoint as SageMaker:
`X-Amz-Target: ResourceGroupsTaggingAPI_20170126.<Op>`, SigV4 signing name `tagging`.

Requests are validated against the service's own shapes, generated from botocore like
SageMaker's (foundation/shapes/tagging.py); the resources and their tags come from
db/tags_repo.py. GetResources lists the tagged models, endpoint configs, endpoints and
optimization jobs (TagFilters: every filter's key present, with one of its Values if any are
given; ResourceTypeFilters: `sagemaker` or `sagemaker:<type>`; or an explicit
ResourceARNList), ordered by ARN and paginated by ResourcesPerPage. TagResources /
UntagResources apply AddTags' / DeleteTags' rules per resource and report failures in
FailedResourcesMap with the service's error codes. Errors are the service's own:
InvalidParameterException (400) naming the parameter.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from eaglenest.api.edge.registry import Context
from eaglenest.db import tags_repo
from eaglenest.foundation import shapes
from eaglenest.foundation.errors import ServiceError, ValidationException
from eaglenest.foundation.shapes.tagging import (
    GetResourcesInput,
    TagResourcesInput,
    UntagResourcesInput,
)

TARGET_PREFIX = "ResourceGroupsTaggingAPI_20170126."
SERVICE = "tagging"
DEFAULT_PER_PAGE, MAX_PER_PAGE = 100, 100


class InvalidParameterException(ServiceError):
    code = "InvalidParameterException"


def _token(offset: int, fingerprint: str) -> str:
    raw = json.dumps({"o": offset, "f": fingerprint}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _offset(token: str | None, fingerprint: str) -> int:
    if token in (None, ""):
        return 0
    try:
        data = json.loads(base64.urlsafe_b64decode(str(token).encode()))
        offset = data["o"]
        ok = data["f"] == fingerprint and isinstance(offset, int) and offset >= 0
    except Exception:
        ok = False
    if not ok:
        raise InvalidParameterException(
            "PaginationToken is not valid for this request (malformed, or the filters changed).")
    return int(offset)


def get_resources(ctx: Context, req: GetResourcesInput) -> dict[str, Any]:
    filters = [(f.Key, list(f.Values or [])) for f in req.TagFilters or [] if f.Key]
    if any(not f.Key for f in req.TagFilters or []):
        raise InvalidParameterException("TagFilters.Key is required in every filter.")
    types, arns = list(req.ResourceTypeFilters or []), list(req.ResourceARNList or [])
    if arns and (filters or types):
        raise InvalidParameterException(
            "ResourceARNList cannot be combined with TagFilters or ResourceTypeFilters.")
    per_page = DEFAULT_PER_PAGE if req.ResourcesPerPage is None else req.ResourcesPerPage
    if not 1 <= per_page <= MAX_PER_PAGE:
        raise InvalidParameterException(
            f"ResourcesPerPage must be an integer from 1 to {MAX_PER_PAGE}.")
    fp = hashlib.sha256(json.dumps([filters, types, arns, per_page]).encode()).hexdigest()[:16]
    start = _offset(req.PaginationToken, fp)
    with ctx.db.session() as s:
        found = tags_repo.tagged(s, ctx.account, arns, filters, types)
    end = start + per_page
    return {"ResourceTagMappingList": [{"ResourceARN": arn, "Tags": tags}
                                       for arn, tags in found[start:end]],
            "PaginationToken": _token(end, fp) if end < len(found) else ""}


def _each_arn(ctx: Context, arns: list[str],
              apply: Callable[[Session, str], object]) -> dict[str, Any]:
    """Apply to each listed resource in its own transaction; failures are reported per ARN,
    with the service's codes (InvalidParameterException for a caller's error)."""
    failed: dict[str, Any] = {}
    for arn in arns:
        try:
            with ctx.db.session() as s:
                apply(s, arn)
        except ServiceError as exc:
            code = "InvalidParameterException" if exc.status < 500 else \
                "InternalServiceException"
            failed[arn] = {"StatusCode": exc.status, "ErrorCode": code,
                           "ErrorMessage": exc.message}
    return {"FailedResourcesMap": failed}


def tag_resources(ctx: Context, req: TagResourcesInput) -> dict[str, Any]:
    as_list = [{"Key": k, "Value": v} for k, v in req.Tags.items()]
    return _each_arn(ctx, list(req.ResourceARNList),
                     lambda s, arn: tags_repo.add(s, ctx.account, arn, as_list))


def untag_resources(ctx: Context, req: UntagResourcesInput) -> dict[str, Any]:
    keys = list(req.TagKeys)
    return _each_arn(ctx, list(req.ResourceARNList),
                     lambda s, arn: tags_repo.delete(s, ctx.account, arn, keys))


OPERATIONS: dict[str, Callable[[Context, Any], dict[str, Any]]] = {
    "GetResources": get_resources,
    "TagResources": tag_resources,
    "UntagResources": untag_resources,
}


def dispatch(ctx: Context, operation: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Validate, run and shape one of OPERATIONS (constraint failures in the service's
    words: InvalidParameterException, the message naming the member)."""
    try:
        req = shapes.parse_input(operation, payload, service=SERVICE)
    except ValidationException as exc:
        raise InvalidParameterException(exc.message) from None
    return shapes.dump_output(operation, OPERATIONS[operation](ctx, req), service=SERVICE)
