"""Create/Describe/List/Stop/DeleteOptimizationJob.

Status changes happen in db.optimization_jobs_repo; training is a Celery task sent with the
job's ARN (it names the account).
"""

from __future__ import annotations

from eaglenest.api.edge.registry import Context
from eaglenest.api.sagemaker.list_pages import list_query, page, spec_of
from eaglenest.api.sagemaker.service import operation
from eaglenest.db import optimization_jobs_repo as jobs
from eaglenest.db.quotas import Limits
from eaglenest.db.repository import list_rows
from eaglenest.db.tables import OptimizationJobRow
from eaglenest.foundation import queue as q
from eaglenest.foundation.shapes.optimization_jobs import (
    CreateOptimizationJobRequest,
    CreateOptimizationJobResponse,
    DeleteOptimizationJobRequest,
    DescribeOptimizationJobRequest,
    DescribeOptimizationJobResponse,
    ListOptimizationJobsRequest,
    ListOptimizationJobsResponse,
    OptimizationJobSummary,
    StopOptimizationJobRequest,
)


@operation("CreateOptimizationJob")
def create_optimization_job(ctx: Context, req: CreateOptimizationJobRequest
                            ) -> CreateOptimizationJobResponse:
    with ctx.db.session() as s:
        row = jobs.create(s, ctx.account, spec_of(req), Limits.of(ctx.settings), ctx.store,
                          tags=req.Tags or ())
        arn = row.arn
    ctx.queue.send(q.OPTIMIZE_TASK, arn, q.TRAIN_QUEUE)
    return CreateOptimizationJobResponse(OptimizationJobArn=arn)


@operation("DescribeOptimizationJob")
def describe_optimization_job(ctx: Context, req: DescribeOptimizationJobRequest
                              ) -> DescribeOptimizationJobResponse:
    with ctx.db.session() as s:
        r = jobs.get(s, req.OptimizationJobName, account=ctx.account)
        return DescribeOptimizationJobResponse.model_validate({
            **r.spec, "OptimizationJobArn": r.arn, "OptimizationJobStatus": r.status,
            "CreationTime": r.creation_time, "LastModifiedTime": r.last_modified_time,
            "OptimizationStartTime": r.start_time, "OptimizationEndTime": r.end_time,
            "FailureReason": r.failure_reason,
            "OptimizationOutput": r.output.get("OptimizationOutput"),
        })


def _summary(r: OptimizationJobRow) -> OptimizationJobSummary:
    return OptimizationJobSummary.model_validate({
        "OptimizationJobName": r.name, "OptimizationJobArn": r.arn,
        "CreationTime": r.creation_time, "OptimizationJobStatus": r.status,
        "OptimizationStartTime": r.start_time, "OptimizationEndTime": r.end_time,
        "LastModifiedTime": r.last_modified_time,
        "DeploymentInstanceType": r.spec["DeploymentInstanceType"],
        "MaxInstanceCount": r.spec.get("MaxInstanceCount"),
        "OptimizationTypes": [t for t in r.optimization_types.split(",") if t],
    })


@operation("ListOptimizationJobs")
def list_optimization_jobs(ctx: Context, req: ListOptimizationJobsRequest
                           ) -> ListOptimizationJobsResponse:
    query = list_query(req, default_order="Ascending", default_max=50, status=req.StatusEquals)
    with ctx.db.session() as s:
        rows, token = list_rows(
            s, OptimizationJobRow, query, ctx.account.account_id,
            contains_type=req.OptimizationContains
        )
        return page(ListOptimizationJobsResponse, "OptimizationJobSummaries",
                    [_summary(r) for r in rows], token)


@operation("StopOptimizationJob")
def stop_optimization_job(ctx: Context, req: StopOptimizationJobRequest) -> None:
    with ctx.db.session() as s:
        jobs.request_stop(s, req.OptimizationJobName, ctx.lease_seconds, ctx.account)


@operation("DeleteOptimizationJob")
def delete_optimization_job(ctx: Context, req: DeleteOptimizationJobRequest) -> None:
    with ctx.db.session() as s:
        jobs.request_delete(s, req.OptimizationJobName, ctx.lease_seconds, ctx.account)
