"""The optimization-job task: takes a job name, reloads state, runs the pipeline, and
leaves the job in exactly one terminal state with a reason a user can act on.

A job that was stopped or deleted before a worker claims it is left alone; a worker that
dies mid-job leaves a lease that expires, and the next worker's reconciliation puts the
job back to STARTING and resumes it from its last training checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from typing import Any

from celery import Celery

from eaglenest.db import models_repo
from eaglenest.db import optimization_jobs_repo as jobs
from eaglenest.db.common import find
from eaglenest.db.tables import ModelRow
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.queue import OPTIMIZE_TASK, TRAIN_QUEUE
from eaglenest.foundation.storage import StorageError, make_store
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.jobs.control import JobControl, JobStopped
from eaglenest.workers.jobs.inputs import EAGLE_CHANNEL, InputError, resolve_sources
from eaglenest.workers.jobs.options import OptionError, parse_options
from eaglenest.workers.serving.process import ServingError
from eaglenest.workers.serving.schedule import ENV_NAME as SCHEDULE_ENV

log = logging.getLogger("eaglenest.optimize")


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions whose message is a FailureReason as it stands."""
    errors: list[type[BaseException]] = [InputError, OptionError, ServingError, StorageError]
    try:
        from eaglenest.models.data import DataError
        from eaglenest.models.target import TargetError

        errors += [DataError, TargetError]
    except ImportError:
        pass
    return tuple(errors)


def run_job(ctx: WorkerContext, job_name: str) -> str:
    with ctx.db.session() as s:
        row = jobs.claim(s, job_name, ctx.owner)
        if row is None:
            return "not-claimed"
        spec, started = dict(row.spec), row.start_time or 0.0
        model = None
        if (spec["ModelSource"].get("SageMakerModel") or {}).get("ModelName"):
            m = find(s, ModelRow, spec["ModelSource"]["SageMakerModel"]["ModelName"])
            model = dict(m.spec) if m else None
    log.info("job %s claimed by worker %s", job_name, ctx.owner)
    max_runtime = spec["StoppingCondition"].get("MaxRuntimeInSeconds")
    try:
        with JobControl(ctx, job_name, max_runtime, started) as control:
            output = _execute(ctx, job_name, spec, model, control)
    except JobStopped as stop:
        return _stopped(ctx, job_name, stop.reason, max_runtime)
    except _user_errors() as exc:
        return _fail(ctx, job_name, str(exc))
    except Exception as exc:  # a bug or an environment fault: still never left stuck
        log.exception("job %s failed", job_name)
        return _fail(ctx, job_name, f"Internal error: {type(exc).__name__}: {exc}")
    with ctx.db.session() as s:
        jobs.complete(s, job_name, output)
    log.info("job %s COMPLETED", job_name)
    shutil.rmtree(ctx.settings.data_dir / "jobs" / job_name, ignore_errors=True)
    return jobs.COMPLETED


def _execute(ctx: WorkerContext, name: str, spec: dict[str, Any], model: dict[str, Any] | None,
             control: JobControl) -> dict[str, Any]:
    try:
        from eaglenest.workers.jobs.pipeline import Pipeline
    except ImportError as exc:
        raise InputError(f"this worker cannot train: install the `train` extra ({exc})") from exc
    options = parse_options(spec.get("OptimizationEnvironment"))
    if options.train_processes is None:
        options = dataclasses.replace(options, train_processes=ctx.settings.train_processes)
    sources = resolve_sources(spec, model)
    work = ctx.settings.data_dir / "jobs" / name
    pipeline = Pipeline(name, spec, options, sources, make_store(ctx.settings), work, control)
    result = pipeline.run()
    output_model = (spec["OutputConfig"].get("SageMakerModel") or {}).get("ModelName")
    if output_model:
        _register_model(ctx, output_model, spec, model, result.head_uri, result.schedule)
    return {"OptimizationOutput": {"RecommendedInferenceImage": "vllm"},
            "ArtifactUri": result.output_uri, "HeadUri": result.head_uri, "Head": result.head,
            "Train": result.train, "Benchmark": result.benchmark}


def _register_model(ctx: WorkerContext, name: str, spec: dict[str, Any],
                    source: dict[str, Any] | None, head_uri: str,
                    schedule: str | None) -> None:
    """The source model's container plus the head as AdditionalModelDataSources
    channel `eagle_model` (what SageMaker's optimized model looks like) and, when the job
    benchmarked, the speculation schedule in its Environment."""
    if source:
        container = dict(source.get("PrimaryContainer") or source["Containers"][0])
        role = source.get("ExecutionRoleArn", spec["RoleArn"])
    else:
        container = {"Image": "vllm", "ModelDataSource": {"S3DataSource": {
            "S3Uri": spec["ModelSource"]["S3"]["S3Uri"], "S3DataType": "S3Prefix",
            "CompressionType": "None"}}}
        role = spec["RoleArn"]
    extras = [e for e in container.get("AdditionalModelDataSources") or []
              if e.get("ChannelName") != EAGLE_CHANNEL]
    extras.append({"ChannelName": EAGLE_CHANNEL, "S3DataSource": {
        "S3Uri": head_uri, "S3DataType": "S3Prefix", "CompressionType": "None"}})
    container["AdditionalModelDataSources"] = extras
    if schedule is not None:
        container["Environment"] = {**(container.get("Environment") or {}),
                                    SCHEDULE_ENV: schedule}
    account = Account(ctx.settings.region, ctx.settings.account_id)
    with ctx.db.session() as s:
        models_repo.create(s, account, {"ModelName": name, "ExecutionRoleArn": role,
                                        "PrimaryContainer": container})


def _fail(ctx: WorkerContext, name: str, reason: str) -> str:
    log.warning("job %s FAILED: %s", name, reason)
    with ctx.db.session() as s:
        jobs.fail(s, name, reason[:1024])
    return jobs.FAILED


def _stopped(ctx: WorkerContext, name: str, reason: str, max_runtime: int | None) -> str:
    if reason == "max-runtime":
        return _fail(ctx, name, f"The job ran longer than StoppingCondition.MaxRuntimeInSeconds "
                                f"({max_runtime} s) and was stopped.")
    if reason == "shutdown":
        with ctx.db.session() as s:
            released = jobs.release(s, name, ctx.owner)
        if released:
            log.warning("job %s handed back at shutdown; it resumes from its checkpoint", name)
            ctx.queue.send(OPTIMIZE_TASK, name, TRAIN_QUEUE)
        return "released"
    if reason == "stopped":
        with ctx.db.session() as s:
            jobs.acknowledge_stop(s, name)
        shutil.rmtree(ctx.settings.data_dir / "jobs" / name, ignore_errors=True)
        return jobs.STOPPED
    return "deleted"


def register(app: Celery, ctx: WorkerContext) -> None:
    @app.task(name=OPTIMIZE_TASK, acks_late=True, reject_on_worker_lost=True)
    def optimize(job_name: str) -> str:
        return run_job(ctx, job_name)
