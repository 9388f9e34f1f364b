"""CreateEndpointConfig, DescribeEndpointConfig, ListEndpointConfigs, DeleteEndpointConfig."""

from __future__ import annotations

from typing import Any

from eaglenest.api.edge.registry import Context, operation
from eaglenest.api.sagemaker.list_pages import list_query, page, spec_of
from eaglenest.db import endpoint_configs_repo
from eaglenest.db.quotas import Limits
from eaglenest.db.repository import list_rows
from eaglenest.db.tables import EndpointConfigRow
from eaglenest.foundation.shapes.endpoint_configs import (
    CreateEndpointConfigInput,
    DeleteEndpointConfigInput,
    DescribeEndpointConfigInput,
    ListEndpointConfigsInput,
)


@operation("CreateEndpointConfig")
def create_endpoint_config(ctx: Context, req: CreateEndpointConfigInput) -> dict[str, Any]:
    with ctx.db.session() as s:
        row = endpoint_configs_repo.create(s, ctx.account, spec_of(req),
                                           ctx.settings.max_instances_per_variant, ctx.store,
                                           Limits.of(ctx.settings))
        return {"EndpointConfigArn": row.arn}


@operation("DescribeEndpointConfig")
def describe_endpoint_config(ctx: Context, req: DescribeEndpointConfigInput) -> dict[str, Any]:
    with ctx.db.session() as s:
        row = endpoint_configs_repo.get(s, ctx.account, req.EndpointConfigName)
        return {**row.spec, "EndpointConfigArn": row.arn, "CreationTime": row.creation_time}


@operation("ListEndpointConfigs")
def list_endpoint_configs(ctx: Context, req: ListEndpointConfigsInput) -> dict[str, Any]:
    with ctx.db.session() as s:
        rows, token = list_rows(s, EndpointConfigRow, list_query(req),
                                 ctx.account.account_id)
        items = [
            {"EndpointConfigName": r.name, "EndpointConfigArn": r.arn,
             "CreationTime": r.creation_time}
            for r in rows
        ]
        return page("EndpointConfigs", items, token)


@operation("DeleteEndpointConfig")
def delete_endpoint_config(ctx: Context, req: DeleteEndpointConfigInput) -> None:
    with ctx.db.session() as s:
        endpoint_configs_repo.delete(s, ctx.account, req.EndpointConfigName)
