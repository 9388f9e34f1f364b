"""AddTags, ListTags, DeleteTags: the tags of any of our resources, by ARN."""

from __future__ import annotations

from eaglenest.api.edge.registry import Context
from eaglenest.api.sagemaker.service import operation
from eaglenest.db import tags_repo
from eaglenest.foundation.shapes.tags import (
    AddTagsInput,
    AddTagsOutput,
    DeleteTagsInput,
    DeleteTagsOutput,
    ListTagsInput,
    ListTagsOutput,
)

#: ListTags's page size when MaxResults is not given (also its lowest allowed value)
DEFAULT_TAGS_PER_PAGE = 50


@operation("AddTags")
def add_tags(ctx: Context, req: AddTagsInput) -> AddTagsOutput:
    with ctx.db.session() as s:
        tags_repo.add(s, ctx.account, req.ResourceArn, req.Tags)
    return AddTagsOutput(Tags=req.Tags)


@operation("ListTags")
def list_tags(ctx: Context, req: ListTagsInput) -> ListTagsOutput:
    with ctx.db.session() as s:
        tags, token = tags_repo.page(s, ctx.account, req.ResourceArn, req.NextToken,
                                     req.MaxResults or DEFAULT_TAGS_PER_PAGE)
    return ListTagsOutput(Tags=tags, NextToken=token or None)


@operation("DeleteTags")
def delete_tags(ctx: Context, req: DeleteTagsInput) -> DeleteTagsOutput:
    with ctx.db.session() as s:
        tags_repo.delete(s, ctx.account, req.ResourceArn, list(req.TagKeys))
    return DeleteTagsOutput()

