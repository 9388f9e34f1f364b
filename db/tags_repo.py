"""Tags of every taggable resource, addressed by ARN (AddTags / ListTags / DeleteTags).

A resource's tags live in its row (`tags`, a list of {"Key", "Value"} in the order they were
first added), so they go with the row when the resource is deleted. Callers pass and get
SageMaker's generated `Tag` shape; only the row holds the JSON form. AWS's rules: at most
50 tags per resource, keys unique per resource (AddTags overwrites the value of a key that is
already there), and keys beginning with `aws:` are reserved for AWS.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from eaglenest.db.repository import find
from eaglenest.db.tables import Base, EndpointConfigRow, EndpointRow, ModelRow, OptimizationJobRow
from eaglenest.foundation import page_tokens
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.errors import ValidationException
from eaglenest.foundation.shapes.shared import Tag

MAX_TAGS = 50
RESERVED_PREFIX = "aws:"

#: ARN resource type -> table
TAGGABLE: dict[str, type[Base]] = {
    "model": ModelRow,
    "endpoint-config": EndpointConfigRow,
    "endpoint": EndpointRow,
    "optimization-job": OptimizationJobRow,
}
#: how SageMaker's tag operations begin their answer for an ARN that names nothing
#: (ValidationException); the ARN follows, so the message names what was not found
NOT_FOUND = "Resource does not exist"

#: a tag as a row stores it: {"Key": ..., "Value": ...}
StoredTag = dict[str, str]


def loaded(tags: Sequence[StoredTag]) -> list[Tag]:
    """A row's tags as shapes; they were checked when written, so they are not re-validated."""
    return [Tag.model_construct(Key=t["Key"], Value=t["Value"]) for t in tags]


def check_new_tags(tags: Sequence[Tag], existing: Sequence[StoredTag] | None = None
                   ) -> list[StoredTag]:
    """`existing` with `tags` added (a key already there takes the new value), as the row
    stores them; raises ValidationException, naming the rule, for a reserved or repeated key
    or more than MAX_TAGS tags in all."""
    seen: set[str] = set()
    for tag in tags:
        key = tag.Key
        if key.lower().startswith(RESERVED_PREFIX):
            raise ValidationException(
                f"Tag keys beginning with '{RESERVED_PREFIX}' are reserved for AWS use: "
                f"'{key}' at 'tags.key' is not allowed.")
        if key in seen:
            raise ValidationException(
                f"Tag keys must be unique per resource: duplicate key '{key}' in 'tags'.")
        seen.add(key)
    merged = {t["Key"]: t["Value"] for t in existing or []}
    merged.update({t.Key: t.Value for t in tags})
    if len(merged) > MAX_TAGS:
        raise ValidationException(
            f"A resource can have at most {MAX_TAGS} tags: this request would give it "
            f"{len(merged)}.")
    return [{"Key": k, "Value": v} for k, v in merged.items()]


def resource_of(session: Session, account: Account, arn: str, *, lock: bool = False) -> Any:
    """The row that `arn` names (our region and account, a taggable type, an existing
    name: compared ignoring case, as ARNs are lower-cased); ValidationException if none,
    worded as SageMaker's."""
    parts = arn.split(":", 5)
    kind, _, name = parts[5].partition("/") if len(parts) == 6 else ("", "", "")
    table = TAGGABLE.get(kind)
    row = None
    if (table is not None and name and "/" not in name and parts[3] == account.region
            and parts[4] == account.account_id):
        row = find(session, table, name, lock=lock, account_id=account.account_id)
    if row is None:
        raise ValidationException(f'{NOT_FOUND}: "{arn}".')
    return row


def add(session: Session, account: Account, arn: str, tags: Sequence[Tag]) -> None:
    row = resource_of(session, account, arn, lock=True)
    row.tags = check_new_tags(tags, row.tags)


def delete(session: Session, account: Account, arn: str, keys: list[str]) -> None:
    """Remove the tags with these keys; keys the resource does not have are ignored."""
    row = resource_of(session, account, arn, lock=True)
    gone = set(keys)
    row.tags = [t for t in row.tags if t["Key"] not in gone]


def _offset(arn: str, token: str | None) -> int:
    if not token:
        return 0
    try:
        offset: int = page_tokens.decode(token, page_tokens.fingerprint(arn),
                                         page_tokens.is_offset)
    except page_tokens.ForeignToken:
        raise ValidationException(
            "Invalid pagination token: NextToken belongs to another resource.") from None
    except page_tokens.MalformedToken:
        raise ValidationException("Invalid pagination token: NextToken is malformed.") from None
    return offset


def page_token(arn: str, offset: int) -> str:
    """The NextToken of `arn`'s tags from `offset` on."""
    return page_tokens.encode(offset, page_tokens.fingerprint(arn))


def page(session: Session, account: Account, arn: str, token: str | None,
         max_results: int) -> tuple[list[Tag], str | None]:
    """One page of the resource's tags in the order they were added, and the next token."""
    start = _offset(arn, token)
    tags = resource_of(session, account, arn).tags
    end = start + max_results
    return loaded(tags[start:end]), (page_token(arn, end) if end < len(tags) else None)


def tagged(session: Session, account: Account, arns: list[str],
           tag_filters: list[tuple[str, list[str]]], types: list[str]
           ) -> list[tuple[str, list[Tag]]]:
    """(ARN, tags) of the account's resources that GetResources lists, ordered by ARN:
    those of `arns` (compared ignoring case, tagged or not) when given, else every tagged
    one; of the `types` (`sagemaker`, `sagemaker:<type>`) when given; and having every
    filter's key, with one of its values when the filter lists any."""
    wanted = {a.lower() for a in arns}
    found: list[tuple[str, list[Tag]]] = []
    for table in TAGGABLE.values():
        for arn, tags in session.execute(select(table.arn, table.tags).where(  # type: ignore[attr-defined]
                table.account_id == account.account_id)):  # type: ignore[attr-defined]
            listed = arn.lower() in wanted if arns else bool(tags)
            if listed and _matches(arn, tags, tag_filters, types):
                found.append((arn, loaded(tags)))
    return sorted(found, key=lambda r: r[0])


def _matches(arn: str, tags: list[StoredTag], tag_filters: list[tuple[str, list[str]]],
             types: list[str]) -> bool:
    kind = "sagemaker:" + arn.split(":", 5)[5].split("/", 1)[0]
    if types and not any(t in ("sagemaker", kind) for t in types):
        return False
    have = {t["Key"]: t["Value"] for t in tags}
    return all(k in have and (not vs or have[k] in vs) for k, vs in tag_filters)
