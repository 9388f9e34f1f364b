"""CreateEndpoint, DescribeEndpoint, ListEndpoints, UpdateEndpoint, DeleteEndpoint.

Status changes happen in db.endpoints_repo; the serving work is a Celery task by name.
"""

from __future__ import annotations

from typing import Any

from eaglenest.api.operations.common import list_query, page, spec_of
from eaglenest.api.registry import Context, operation
from eaglenest.db import endpoints_repo
from eaglenest.db.common import find, list_rows
from eaglenest.db.tables import EndpointConfigRow, EndpointRow
from eaglenest.foundation import queue as q
from eaglenest.foundation.shapes.endpoints import (
    CreateEndpointInput,
    DeleteEndpointInput,
    DescribeEndpointInput,
    ListEndpointsInput,
    UpdateEndpointInput,
)


@operation("CreateEndpoint")
def create_endpoint(ctx: Context, req: CreateEndpointInput) -> dict[str, Any]:
    with ctx.db.session() as s:
        row = endpoints_repo.create(s, ctx.account, spec_of(req))
        arn, name = row.arn, row.name
    ctx.queue.send(q.ENDPOINT_CREATE_TASK, name, q.SERVE_QUEUE)
    return {"EndpointArn": arn}


def _capture_summary(config: EndpointConfigRow | None) -> dict[str, Any] | None:
    capture = config.spec.get("DataCaptureConfig") if config else None
    if not capture:
        return None
    enabled = capture.get("EnableCapture", True)
    return {
        "EnableCapture": enabled,
        "CaptureStatus": "Started" if enabled else "Stopped",
        "CurrentSamplingPercentage": capture["InitialSamplingPercentage"],
        "DestinationS3Uri": capture["DestinationS3Uri"],
        "KmsKeyId": capture.get("KmsKeyId", ""),
    }


@operation("DescribeEndpoint")
def describe_endpoint(ctx: Context, req: DescribeEndpointInput) -> dict[str, Any]:
    with ctx.db.session() as s:
        row = endpoints_repo.get(s, ctx.account, req.EndpointName)
        out: dict[str, Any] = {
            "EndpointName": row.name, "EndpointArn": row.arn,
            "EndpointConfigName": row.config_name, "EndpointStatus": row.status,
            "CreationTime": row.creation_time, "LastModifiedTime": row.last_modified_time,
            "FailureReason": row.failure_reason,
            "ProductionVariants": row.deployment.get("ProductionVariants"),
            "DataCaptureConfig": _capture_summary(find(s, EndpointConfigRow, row.config_name)),
            "LastDeploymentConfig": row.spec.get("DeploymentConfig"),
        }
        if row.pending_config_name:
            out["PendingDeploymentSummary"] = {"EndpointConfigName": row.pending_config_name}
        return {k: v for k, v in out.items() if v is not None}


@operation("ListEndpoints")
def list_endpoints(ctx: Context, req: ListEndpointsInput) -> dict[str, Any]:
    with ctx.db.session() as s:
        rows, token = list_rows(s, EndpointRow, list_query(req, status=req.StatusEquals))
        items = [
            {"EndpointName": r.name, "EndpointArn": r.arn, "CreationTime": r.creation_time,
             "LastModifiedTime": r.last_modified_time, "EndpointStatus": r.status}
            for r in rows
        ]
        return page("Endpoints", items, token)


@operation("UpdateEndpoint")
def update_endpoint(ctx: Context, req: UpdateEndpointInput) -> dict[str, Any]:
    with ctx.db.session() as s:
        row = endpoints_repo.request_update(
            s, ctx.account, req.EndpointName, req.EndpointConfigName, spec_of(req)
        )
        arn, name = row.arn, row.name
    ctx.queue.send(q.ENDPOINT_UPDATE_TASK, name, q.SERVE_QUEUE)
    return {"EndpointArn": arn}


@operation("DeleteEndpoint")
def delete_endpoint(ctx: Context, req: DeleteEndpointInput) -> None:
    with ctx.db.session() as s:
        needs_worker = endpoints_repo.request_delete(s, ctx.account, req.EndpointName)
    if needs_worker:
        ctx.queue.send(q.ENDPOINT_DELETE_TASK, req.EndpointName, q.SERVE_QUEUE)
