"""The Resource Groups Tagging API for our resources, on the same endpoint as SageMaker:
`X-Amz-Target: ResourceGroupsTaggingAPI_20170126.<Op>`, SigV4 signing name `tagging`.

GetResources lists the tagged models, endpoint configs, endpoints and optimization jobs
(TagFilters: every filter's key present, with one of its Values if any are given;
ResourceTypeFilters: `sagemaker` or `sagemaker:<type>`; or an explicit ResourceARNList),
ordered by ARN and paginated by ResourcesPerPage. TagResources / UntagResources apply
AddTags' / DeleteTags' rules per resource and report failures in FailedResourcesMap.
Errors are the service's own: InvalidParameterException (400) naming the parameter.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from eaglenest.api.registry import Context
from eaglenest.db import tags_repo
from eaglenest.db.tables import EndpointConfigRow, EndpointRow, ModelRow, OptimizationJobRow
from eaglenest.foundation.errors import ServiceError

TARGET_PREFIX = "ResourceGroupsTaggingAPI_20170126."
SERVICE = "tagging"
TABLES = (ModelRow, EndpointConfigRow, EndpointRow, OptimizationJobRow)
DEFAULT_PER_PAGE, MAX_PER_PAGE = 100, 100


class InvalidParameterException(ServiceError):
    code = "InvalidParameterException"


def _list(payload: dict[str, Any], key: str, kind: type, low: int, high: int) -> list[Any]:
    value = payload.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, kind) for v in value):
        raise InvalidParameterException(f"{key} must be a list of {kind.__name__}.")
    if not low <= len(value) <= high:
        raise InvalidParameterException(f"{key} must have {low} to {high} members.")
    return value


def _tag_filters(payload: dict[str, Any]) -> list[tuple[str, list[str]]]:
    out = []
    for f in _list(payload, "TagFilters", dict, 0, 50):
        key, values = f.get("Key"), f.get("Values") or []
        if not isinstance(key, str) or not 1 <= len(key) <= 128:
            raise InvalidParameterException("TagFilters.Key must be a string of 1 to 128 "
                                            "characters.")
        if not isinstance(values, list) or len(values) > 20 or not all(
                isinstance(v, str) for v in values):
            raise InvalidParameterException("TagFilters.Values must be a list of at most 20 "
                                            "strings.")
        out.append((key, values))
    return out


def _type_of(arn: str) -> str:
    """`sagemaker:<type>` of one of our ARNs."""
    return "sagemaker:" + arn.split(":", 5)[5].split("/", 1)[0]


def _matches(arn: str, tags: list[dict[str, str]], filters: list[tuple[str, list[str]]],
             types: list[str]) -> bool:
    if types and not any(t == "sagemaker" or t == _type_of(arn) for t in types):
        return False
    have = {t["Key"]: t["Value"] for t in tags}
    return all(k in have and (not vs or have[k] in vs) for k, vs in filters)


def _token(offset: int, fingerprint: str) -> str:
    raw = json.dumps({"o": offset, "f": fingerprint}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _offset(token: Any, fingerprint: str) -> int:
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


def get_resources(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    filters, types = _tag_filters(payload), _list(payload, "ResourceTypeFilters", str, 0, 100)
    arns = _list(payload, "ResourceARNList", str, 1, 100)
    if arns and (filters or types):
        raise InvalidParameterException(
            "ResourceARNList cannot be combined with TagFilters or ResourceTypeFilters.")
    per_page = payload.get("ResourcesPerPage", DEFAULT_PER_PAGE)
    if not isinstance(per_page, int) or isinstance(per_page, bool) or not (
            1 <= per_page <= MAX_PER_PAGE):
        raise InvalidParameterException(
            f"ResourcesPerPage must be an integer from 1 to {MAX_PER_PAGE}.")
    fp = hashlib.sha256(json.dumps([filters, types, arns, per_page]).encode()).hexdigest()[:16]
    start = _offset(payload.get("PaginationToken"), fp)
    wanted = {a.lower() for a in arns}
    found: list[dict[str, Any]] = []
    with ctx.db.session() as s:
        for table in TABLES:
            for arn, tags in s.execute(select(table.arn, table.tags).where(
                    table.account_id == ctx.account.account_id)):
                listed = arn.lower() in wanted if arns else bool(tags)
                if listed and _matches(arn, tags, filters, types):
                    found.append({"ResourceARN": arn, "Tags": list(tags)})
    found.sort(key=lambda r: str(r["ResourceARN"]))
    end = start + per_page
    return {"ResourceTagMappingList": found[start:end],
            "PaginationToken": _token(end, fp) if end < len(found) else ""}


def _each_arn(ctx: Context, payload: dict[str, Any],
              apply: Callable[[Any, str], object]) -> dict[str, Any]:
    """Apply to each listed resource in its own transaction; failures are reported per ARN."""
    failed: dict[str, Any] = {}
    for arn in _list(payload, "ResourceARNList", str, 1, 20) or _missing("ResourceARNList"):
        try:
            with ctx.db.session() as s:
                apply(s, arn)
        except ServiceError as exc:
            failed[arn] = {"StatusCode": exc.status, "ErrorCode": exc.code,
                           "ErrorMessage": exc.message}
    return {"FailedResourcesMap": failed}


def _missing(key: str) -> list[Any]:
    raise InvalidParameterException(f"{key} is required.")


def tag_resources(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    tags = payload.get("Tags")
    if not isinstance(tags, dict) or not 1 <= len(tags) <= 50 or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
        raise InvalidParameterException("Tags must be a map of 1 to 50 string keys and values.")
    if not all(1 <= len(k) <= 128 and len(v) <= 256 for k, v in tags.items()):
        raise InvalidParameterException("Tags: keys must have 1 to 128 characters, values at "
                                        "most 256.")
    as_list = [{"Key": k, "Value": v} for k, v in tags.items()]
    return _each_arn(ctx, payload,
                     lambda s, arn: tags_repo.add(s, ctx.account, arn, as_list))


def untag_resources(ctx: Context, payload: dict[str, Any]) -> dict[str, Any]:
    keys = _list(payload, "TagKeys", str, 1, 50) or _missing("TagKeys")
    return _each_arn(ctx, payload,
                     lambda s, arn: tags_repo.delete(s, ctx.account, arn, keys))


OPERATIONS: dict[str, Callable[[Context, dict[str, Any]], dict[str, Any]]] = {
    "GetResources": get_resources,
    "TagResources": tag_resources,
    "UntagResources": untag_resources,
}
