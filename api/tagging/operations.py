"""The Resource Groups Tagging API for our resources, on the same endpoint as SageMaker:
`X-Amz-Target: ResourceGroupsTaggingAPI_20170126.<Op>`, SigV4 signing name `tagging`.

Its operations are registered with the same `@operation` check as SageMaker's (SERVICE,
api/edge/registry.py); requests are validated against the service's own shapes, generated
from botocore like SageMaker's (foundation/shapes/tagging.py); the resources and their tags
come from db/tags_repo.py. GetResources lists the tagged models, endpoint configs, endpoints and
optimization jobs (TagFilters: every filter's key present, with one of its Values if any are
given; ResourceTypeFilters: `sagemaker` or `sagemaker:<type>`; or an explicit
ResourceARNList), ordered by ARN and paginated by ResourcesPerPage. TagResources /
UntagResources apply AddTags' / DeleteTags' rules per resource and report failures in
FailedResourcesMap with the service's error codes. Errors are the service's own:
InvalidParameterException (400) naming the parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from eaglenest.api.edge.registry import Context, JsonService
from eaglenest.db import tags_repo
from eaglenest.foundation import page_tokens
from eaglenest.foundation.errors import ServiceError
from eaglenest.foundation.shapes.shared import Tag
from eaglenest.foundation.shapes.tagging import (
    GetResourcesInput,
    GetResourcesOutput,
    TagResourcesInput,
    TagResourcesOutput,
    UntagResourcesInput,
    UntagResourcesOutput,
)

TARGET_PREFIX = "ResourceGroupsTaggingAPI_20170126."
DEFAULT_PER_PAGE, MAX_PER_PAGE = 100, 100


class InvalidParameterException(ServiceError):
    code = "InvalidParameterException"


SERVICE = JsonService(signing_name="tagging", target_prefix=TARGET_PREFIX,
                      label_prefix="tagging:", invalid_request=InvalidParameterException)


def _offset(token: str | None, fingerprint: str) -> int:
    if not token:
        return 0
    try:
        offset: int = page_tokens.decode(token, fingerprint, page_tokens.is_offset)
    except page_tokens.MalformedToken:
        raise InvalidParameterException(
            "PaginationToken is not valid for this request (malformed, or the filters changed)."
        ) from None
    return offset


@SERVICE.operation("GetResources")
def get_resources(ctx: Context, req: GetResourcesInput) -> GetResourcesOutput:
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
    fp = page_tokens.fingerprint([filters, types, arns, per_page])
    start = _offset(req.PaginationToken, fp)
    with ctx.db.session() as s:
        found = tags_repo.tagged(s, ctx.account, arns, filters, types)
    end = start + per_page
    mappings = [{"ResourceARN": arn, "Tags": [t.model_dump() for t in tags]}
                for arn, tags in found[start:end]]
    return GetResourcesOutput.model_validate({
        "ResourceTagMappingList": mappings,
        "PaginationToken": page_tokens.encode(end, fp) if end < len(found) else ""})


def _each_arn(ctx: Context, arns: list[str], apply: Callable[[Session, str], object]
              ) -> dict[str, Any]:
    """Apply to each listed resource in its own transaction; failures are reported per ARN
    (FailedResourcesMap's members), with the service's codes (InvalidParameterException for
    a caller's error)."""
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


@SERVICE.operation("TagResources")
def tag_resources(ctx: Context, req: TagResourcesInput) -> TagResourcesOutput:
    # checked against this service's shapes, not re-validated against SageMaker's Tag
    tags = [Tag.model_construct(Key=k, Value=v) for k, v in req.Tags.items()]
    return TagResourcesOutput.model_validate(_each_arn(
        ctx, list(req.ResourceARNList), lambda s, arn: tags_repo.add(s, ctx.account, arn, tags)))


@SERVICE.operation("UntagResources")
def untag_resources(ctx: Context, req: UntagResourcesInput) -> UntagResourcesOutput:
    keys = list(req.TagKeys)
    return UntagResourcesOutput.model_validate(_each_arn(
        ctx, list(req.ResourceARNList), lambda s, arn: tags_repo.delete(s, ctx.account, arn, keys)))
