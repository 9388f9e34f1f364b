"""CreateModel, DescribeModel, ListModels, DeleteModel."""

from __future__ import annotations

from eaglenest.api.edge.registry import Context
from eaglenest.api.sagemaker.list_pages import described, list_query, named_page, spec_of
from eaglenest.api.sagemaker.service import operation
from eaglenest.db import models_repo
from eaglenest.db.quotas import Limits
from eaglenest.db.repository import list_rows
from eaglenest.db.tables import ModelRow
from eaglenest.foundation.shapes.models import (
    CreateModelInput,
    CreateModelOutput,
    DeleteModelInput,
    DescribeModelInput,
    DescribeModelOutput,
    ListModelsInput,
    ListModelsOutput,
)


@operation("CreateModel")
def create_model(ctx: Context, req: CreateModelInput) -> CreateModelOutput:
    with ctx.db.session() as s:
        row = models_repo.create(s, ctx.account, spec_of(req), ctx.store,
                                 Limits.of(ctx.settings), tags=req.Tags or ())
        return CreateModelOutput(ModelArn=row.arn)


@operation("DescribeModel")
def describe_model(ctx: Context, req: DescribeModelInput) -> DescribeModelOutput:
    with ctx.db.session() as s:
        row = models_repo.get(s, ctx.account, req.ModelName)
        return described(DescribeModelOutput, row, "Model")


@operation("ListModels")
def list_models(ctx: Context, req: ListModelsInput) -> ListModelsOutput:
    with ctx.db.session() as s:
        rows, token = list_rows(s, ModelRow, list_query(req), ctx.account.account_id)
        return named_page(ListModelsOutput, "Models", "Model", rows, token)


@operation("DeleteModel")
def delete_model(ctx: Context, req: DeleteModelInput) -> None:
    with ctx.db.session() as s:
        models_repo.delete(s, ctx.account, req.ModelName)
