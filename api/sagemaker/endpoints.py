"""CreateEndpoint, DescribeEndpoint, ListEndpoints, UpdateEndpoint,
UpdateEndpointWeightsAndCapacities, DeleteEndpoint.

Status changes happen in db.endpoints_repo; the serving work is a Celery task sent with the
endpoint's ARN (it names the account).
"""

from __future__ import annotations

from typing import Any

from eaglenest.api.edge.registry import Context
from eaglenest.api.sagemaker.list_pages import list_query, page, spec_of
from eaglenest.api.sagemaker.service import operation
from eaglenest.db import endpoint_retention as retention
from eaglenest.db import endpoints_repo
from eaglenest.db.quotas import Limits
from eaglenest.db.repository import list_rows
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation import queue as q
from eaglenest.foundation.deployment import variant_summaries
from eaglenest.foundation.shapes import to_wire
from eaglenest.foundation.shapes.endpoints import (
    CreateEndpointInput,
    CreateEndpointOutput,
    DataCaptureConfigSummary,
    DeleteEndpointInput,
    DescribeEndpointInput,
    DescribeEndpointOutput,
    ListEndpointsInput,
    ListEndpointsOutput,
    PendingDeploymentSummary,
    UpdateEndpointInput,
    UpdateEndpointOutput,
    UpdateEndpointWeightsAndCapacitiesInput,
    UpdateEndpointWeightsAndCapacitiesOutput,
)


@operation("CreateEndpoint")
def create_endpoint(ctx: Context, req: CreateEndpointInput) -> CreateEndpointOutput:
    with ctx.db.session() as s:
        row = endpoints_repo.create(s, ctx.account, spec_of(req), Limits.of(ctx.settings),
                                    ctx.store, tags=req.Tags or ())
        arn = row.arn
    ctx.queue.send(q.ENDPOINT_CREATE_TASK, arn, q.SERVE_QUEUE)
    return CreateEndpointOutput(EndpointArn=arn)


def _capture_summary(capture: dict[str, Any] | None) -> DataCaptureConfigSummary | None:
    """The Data Capture in force (db.endpoint_retention.capture_config), as described."""
    if not capture:
        return None
    enabled = capture.get("EnableCapture", True)
    return DataCaptureConfigSummary.model_validate({
        "EnableCapture": enabled,
        "CaptureStatus": "Started" if enabled else "Stopped",
        "CurrentSamplingPercentage": capture["InitialSamplingPercentage"],
        "DestinationS3Uri": capture["DestinationS3Uri"],
        "KmsKeyId": capture.get("KmsKeyId", ""),
    })


def _pending_summary(row: EndpointRow) -> PendingDeploymentSummary | None:
    """The config being deployed and, once its fleet takes traffic, its variants with the
    step they are in (VariantStatus)."""
    if not row.pending_config_name:
        return None
    out: dict[str, Any] = {"EndpointConfigName": row.pending_config_name,
                           "StartTime": row.last_modified_time}
    shift = row.deployment.get(endpoints_repo.SHIFT)
    if shift:
        out["ProductionVariants"] = [{**v, "VariantStatus": [shift["Status"]]}
                                     for v in variant_summaries(shift) or []]
    return PendingDeploymentSummary.model_validate(out)


@operation("DescribeEndpoint")
def describe_endpoint(ctx: Context, req: DescribeEndpointInput) -> DescribeEndpointOutput:
    with ctx.db.session() as s:
        row = endpoints_repo.get(s, ctx.account, req.EndpointName)
        return DescribeEndpointOutput.model_validate({
            "EndpointName": row.name, "EndpointArn": row.arn,
            "EndpointConfigName": row.config_name, "EndpointStatus": row.status,
            "CreationTime": row.creation_time, "LastModifiedTime": row.last_modified_time,
            "FailureReason": row.failure_reason,
            "ProductionVariants": variant_summaries(row.deployment),
            "DataCaptureConfig": _capture_summary(retention.capture_config(
                row.spec, endpoints_repo.config_spec(s, row))),
            "LastDeploymentConfig": row.spec.get("DeploymentConfig"),
            "PendingDeploymentSummary": _pending_summary(row),
        })


@operation("ListEndpoints")
def list_endpoints(ctx: Context, req: ListEndpointsInput) -> ListEndpointsOutput:
    with ctx.db.session() as s:
        rows, token = list_rows(s, EndpointRow, list_query(req, status=req.StatusEquals),
                                 ctx.account.account_id)
        items = [
            {"EndpointName": r.name, "EndpointArn": r.arn, "CreationTime": r.creation_time,
             "LastModifiedTime": r.last_modified_time, "EndpointStatus": r.status}
            for r in rows
        ]
        return page(ListEndpointsOutput, "Endpoints", items, token)


@operation("UpdateEndpoint")
def update_endpoint(ctx: Context, req: UpdateEndpointInput) -> UpdateEndpointOutput:
    with ctx.db.session() as s:
        row = endpoints_repo.request_update(
            s, ctx.account, req.EndpointName, req.EndpointConfigName, spec_of(req),
            Limits.of(ctx.settings), ctx.store)
        arn = row.arn
    ctx.queue.send(q.ENDPOINT_UPDATE_TASK, arn, q.SERVE_QUEUE)
    return UpdateEndpointOutput(EndpointArn=arn)


@operation("UpdateEndpointWeightsAndCapacities")
def update_endpoint_weights_and_capacities(
    ctx: Context, req: UpdateEndpointWeightsAndCapacitiesInput
) -> UpdateEndpointWeightsAndCapacitiesOutput:
    desired = [to_wire(d) for d in req.DesiredWeightsAndCapacities]
    with ctx.db.session() as s:
        row = endpoints_repo.request_weights(
            s, ctx.account, req.EndpointName, desired,
            ctx.settings.max_instances_per_variant, Limits.of(ctx.settings))
        arn = row.arn
    ctx.queue.send(q.ENDPOINT_UPDATE_TASK, arn, q.SERVE_QUEUE)  # applies weights too
    return UpdateEndpointWeightsAndCapacitiesOutput(EndpointArn=arn)


@operation("DeleteEndpoint")
def delete_endpoint(ctx: Context, req: DeleteEndpointInput) -> None:
    with ctx.db.session() as s:
        arn = endpoints_repo.request_delete(s, ctx.account, req.EndpointName)
    if arn is not None:  # a worker must stop its serving processes
        ctx.queue.send(q.ENDPOINT_DELETE_TASK, arn, q.SERVE_QUEUE)
