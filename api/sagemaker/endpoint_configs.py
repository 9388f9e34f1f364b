"""CreateEndpointConfig, DescribeEndpointConfig, ListEndpointConfigs, DeleteEndpointConfig."""

from __future__ import annotations

from eaglenest.api.edge.registry import Context
from eaglenest.api.sagemaker.list_pages import described, list_query, named_page, spec_of
from eaglenest.api.sagemaker.service import operation
from eaglenest.db import endpoint_configs_repo
from eaglenest.db.quotas import Limits
from eaglenest.db.repository import list_rows
from eaglenest.db.tables import EndpointConfigRow
from eaglenest.foundation.shapes.endpoint_configs import (
    CreateEndpointConfigInput,
    CreateEndpointConfigOutput,
    DeleteEndpointConfigInput,
    DescribeEndpointConfigInput,
    DescribeEndpointConfigOutput,
    ListEndpointConfigsInput,
    ListEndpointConfigsOutput,
)


@operation("CreateEndpointConfig")
def create_endpoint_config(ctx: Context, req: CreateEndpointConfigInput
                           ) -> CreateEndpointConfigOutput:
    with ctx.db.session() as s:
        row = endpoint_configs_repo.create(s, ctx.account, spec_of(req),
                                           ctx.settings.max_instances_per_variant, ctx.store,
                                           Limits.of(ctx.settings), tags=req.Tags or ())
        return CreateEndpointConfigOutput(EndpointConfigArn=row.arn)


@operation("DescribeEndpointConfig")
def describe_endpoint_config(ctx: Context, req: DescribeEndpointConfigInput
                             ) -> DescribeEndpointConfigOutput:
    with ctx.db.session() as s:
        row = endpoint_configs_repo.get(s, ctx.account, req.EndpointConfigName)
        return described(DescribeEndpointConfigOutput, row, "EndpointConfig")


@operation("ListEndpointConfigs")
def list_endpoint_configs(ctx: Context, req: ListEndpointConfigsInput
                          ) -> ListEndpointConfigsOutput:
    with ctx.db.session() as s:
        rows, token = list_rows(s, EndpointConfigRow, list_query(req),
                                 ctx.account.account_id)
        return named_page(ListEndpointConfigsOutput, "EndpointConfigs", "EndpointConfig",
                          rows, token)


@operation("DeleteEndpointConfig")
def delete_endpoint_config(ctx: Context, req: DeleteEndpointConfigInput) -> None:
    with ctx.db.session() as s:
        endpoint_configs_repo.delete(s, ctx.account, req.EndpointConfigName)
