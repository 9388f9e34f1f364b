"""AddTags, ListTags, DeleteTags: the tags of any of our resources, by ARN."""

from __future__ import annotations

from typing import Any

from eaglenest.api.edge.registry import Context, operation
from eaglenest.api.sagemaker.list_pages import spec_of
from eaglenest.db import tags_repo
from eaglenest.foundation.shapes.tags import AddTagsInput, DeleteTagsInput, ListTagsInput

#: ListTags's page size when MaxResults is not given (also its lowest allowed value)
DEFAULT_TAGS_PER_PAGE = 50


@operation("AddTags")
def add_tags(ctx: Context, req: AddTagsInput) -> dict[str, Any]:
    tags = spec_of(req)["Tags"]
    with ctx.db.session() as s:
        tags_repo.add(s, ctx.account, req.ResourceArn, tags)
    return {"Tags": tags}


@operation("ListTags")
def list_tags(ctx: Context, req: ListTagsInput) -> dict[str, Any]:
    with ctx.db.session() as s:
        tags, token = tags_repo.page(s, ctx.account, req.ResourceArn, req.NextToken,
                                     req.MaxResults or DEFAULT_TAGS_PER_PAGE)
    out: dict[str, Any] = {"Tags": tags}
    if token:
        out["NextToken"] = token
    return out


@operation("DeleteTags")
def delete_tags(ctx: Context, req: DeleteTagsInput) -> None:
    with ctx.db.session() as s:
        tags_repo.delete(s, ctx.account, req.ResourceArn, list(req.TagKeys))
