"""CreateModel, DescribeModel, ListModels, DeleteModel."""

from __future__ import annotations

from typing import Any

from eaglenest.api.edge.registry import Context, operation
from eaglenest.api.sagemaker.list_pages import list_query, page, spec_of
from eaglenest.db import models_repo
from eaglenest.db.quotas import Limits
from eaglenest.db.repository import list_rows
from eaglenest.db.tables import ModelRow
from eaglenest.foundation.shapes.models import (
    CreateModelInput,
    DeleteModelInput,
    DescribeModelInput,
    ListModelsInput,
)


@operation("CreateModel")
def create_model(ctx: Context, req: CreateModelInput) -> dict[str, Any]:
    with ctx.db.session() as s:
        row = models_repo.create(s, ctx.account, spec_of(req), ctx.store,
                                 Limits.of(ctx.settings))
        return {"ModelArn": row.arn}


@operation("DescribeModel")
def describe_model(ctx: Context, req: DescribeModelInput) -> dict[str, Any]:
    with ctx.db.session() as s:
        row = models_repo.get(s, ctx.account, req.ModelName)
        return {**row.spec, "ModelArn": row.arn, "CreationTime": row.creation_time}


@operation("ListModels")
def list_models(ctx: Context, req: ListModelsInput) -> dict[str, Any]:
    with ctx.db.session() as s:
        rows, token = list_rows(s, ModelRow, list_query(req), ctx.account.account_id)
        items = [
            {"ModelName": r.name, "ModelArn": r.arn, "CreationTime": r.creation_time}
            for r in rows
        ]
        return page("Models", items, token)


@operation("DeleteModel")
def delete_model(ctx: Context, req: DeleteModelInput) -> None:
    with ctx.db.session() as s:
        models_repo.delete(s, ctx.account, req.ModelName)
