"""The optimization-job task: takes a job's ARN, reloads state, runs the pipeline, and
leaves the job in exactly one terminal state with a reason a user can act on.

A job that was stopped or deleted before a worker claims it is left alone; a worker that
dies mid-job leaves a lease that expires, and the next worker's reconciliation puts the
job back to STARTING and resumes it from its last training checkpoint.

Completion is one transaction: the job becomes COMPLETED and its output SageMaker model is
registered together, and only by the worker that owns the job (a worker whose lease was
taken over discards its result). A model name taken after CreateOptimizationJob checked it
never fails a finished job: the job completes, the model is not registered (logged).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy.orm import Session

from eaglenest.db import models_repo
from eaglenest.db import optimization_jobs_repo as jobs
from eaglenest.db.repository import find, resolve
from eaglenest.db.tables import ModelRow, OptimizationJobRow
from eaglenest.foundation import environment
from eaglenest.foundation.accounts import Account, ResourceRef
from eaglenest.foundation.errors import ValidationException
from eaglenest.foundation.host.ceilings import LimitError, check_train_processes
from eaglenest.foundation.host.threads import ComputeBudgetExceeded, compute_budget
from eaglenest.foundation.instance_types import UnsupportedInstanceType, lookup
from eaglenest.foundation.queue import OPTIMIZE_TASK, TRAIN_QUEUE
from eaglenest.foundation.shapes import StoredShapeError, rebuild, to_wire
from eaglenest.foundation.shapes.models import (
    AdditionalModelDataSource,
    ContainerDefinition,
    CreateModelInput,
    ModelDataSource,
    S3ModelDataSource,
)
from eaglenest.foundation.shapes.optimization_jobs import CreateOptimizationJobRequest
from eaglenest.foundation.store.buckets import AccountStore
from eaglenest.foundation.store.storage import StorageError, make_store
from eaglenest.models.heads.registry import HEADS
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.infra.model_fetch import EAGLE_CHANNEL, InputError, model_container
from eaglenest.workers.jobs import placing
from eaglenest.workers.jobs.control import JobControl, JobStopped
from eaglenest.workers.jobs.inputs import resolve_sources
from eaglenest.workers.jobs.options import OptionError, parse_options
from eaglenest.workers.model_servers.process import ServingError, default_backend
from eaglenest.workers.model_servers.schedule import SCHEDULE_ENV

log = logging.getLogger("eaglenest.optimize")
#: the model container variable naming the serving backend (workers/serving/deploy.py)
BACKEND_ENV = "EAGLENEST_SERVING_BACKEND"
#: the model container variable naming the embedded engine's decode mode (deploy.py)
MODE_ENV = "EAGLENEST_DECODE_MODE"


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions whose message is a FailureReason as it stands."""
    errors: list[type[BaseException]] = [InputError, OptionError, ServingError, StorageError,
                                         LimitError, ComputeBudgetExceeded]
    try:
        from eaglenest.models.data import DataError
        from eaglenest.models.target import TargetError

        errors += [DataError, TargetError]
    except ImportError:
        pass
    return tuple(errors)


def run_job(ctx: WorkerContext, ref: str) -> str:
    """The task: `ref` is the job's ARN (a bare name from before names were per account is
    taken only while one account has a job of that name)."""
    with ctx.db.session() as s:
        job_ref = resolve(s, OptimizationJobRow, ref)
    if job_ref is None:
        log.warning("optimization task %s: no single job has this ARN or name; skipped", ref)
        return "not-found"
    placed = placing.place(ctx, job_ref)
    if isinstance(placed, str):
        return placed
    try:
        return _run(ctx, job_ref, placed.gpus)
    finally:
        placing.release(ctx, job_ref, placed)


def _run(ctx: WorkerContext, ref: ResourceRef, gpus: list[int]) -> str:
    with ctx.db.session() as s:
        row = jobs.claim(s, ref.arn, ctx.owner)
        if row is None:
            return "not-claimed"
        started, name = row.start_time or 0.0, row.name
        try:
            job, model = _requests(s, row.spec, row.account_id)
        except StoredShapeError as exc:
            broken: str | None = f"Internal error: {exc}"
        else:
            broken = None
    if broken is not None:
        return _fail(ctx, ref, broken)
    log.info("job %s claimed by worker %s", ref.name, ctx.owner)
    max_runtime = job.StoppingCondition.MaxRuntimeInSeconds
    try:
        with JobControl(ctx, ref.arn, max_runtime, started) as control:
            output, output_model = _execute(ctx, ref, name, job, model, control, gpus)
    except JobStopped as stop:
        return _stopped(ctx, ref, stop.reason, max_runtime)
    except _user_errors() as exc:
        return _fail(ctx, ref, str(exc))
    except Exception as exc:  # a bug or an environment fault: still never left stuck
        log.exception("job %s failed", ref.name)
        return _fail(ctx, ref, f"Internal error: {type(exc).__name__}: {exc}")
    if not _complete(ctx, ref, output, output_model):
        log.warning("job %s is no longer this worker's (lease lost); result discarded",
                    ref.name)
        return "lease-lost"
    log.info("job %s COMPLETED", ref.name)
    shutil.rmtree(work_dir(ctx, ref), ignore_errors=True)
    return jobs.COMPLETED


def work_dir(ctx: WorkerContext, ref: ResourceRef) -> Path:
    """The job's files on this host: `<data dir>/jobs/<account>/<name>`."""
    return ctx.settings.data_dir / "jobs" / ref.local_key


def _complete(ctx: WorkerContext, ref: ResourceRef, output: dict[str, Any],
              output_model: dict[str, Any] | None) -> bool:
    """COMPLETED and the output model registered, in one transaction; False if not ours."""
    with ctx.db.session() as s:
        if not jobs.complete(s, ref.arn, ctx.owner, output):
            return False
        if output_model is not None:
            account = Account(ctx.settings.region, ref.account_id)
            try:
                models_repo.create(s, account, output_model)
            except ValidationException as exc:  # taken since CreateOptimizationJob
                log.warning("job %s: output model not registered: %s", ref.name, exc)
    return True


def _requests(s: Session, stored: dict[str, Any], account_id: str
              ) -> tuple[CreateOptimizationJobRequest, CreateModelInput | None]:
    """The job's request and its source model's (ModelSource.SageMakerModel, a model of
    the job's account), rebuilt."""
    job = rebuild(CreateOptimizationJobRequest, stored)
    source = job.ModelSource.SageMakerModel
    if not (source and source.ModelName):
        return job, None
    row = find(s, ModelRow, source.ModelName, account_id=account_id)
    return job, rebuild(CreateModelInput, row.spec) if row else None


def _execute(ctx: WorkerContext, ref: ResourceRef, name: str,
             job: CreateOptimizationJobRequest, model: CreateModelInput | None,
             control: JobControl, gpus: list[int]
             ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Run the pipeline; every store access (inputs, checkpoints, progress, outputs) goes
    through the job account's view: another account's bucket fails the job (AccessDenied
    naming the URI), even one that changed owner after CreateOptimizationJob."""
    try:
        from eaglenest.workers.jobs.pipeline import Pipeline
    except ImportError as exc:
        raise InputError(f"this worker cannot train: install the `train` extra ({exc})") from exc
    options = parse_options(job.OptimizationEnvironment)
    ignored = environment.ignored_warning(job.OptimizationEnvironment, "OptimizationEnvironment")
    if ignored:
        log.warning("job %s %s", ref.name, ignored)
    if options.train_processes is None:  # one rank per GPU the job holds
        options = options.model_copy(update={
            "train_processes": len(gpus) or ctx.settings.train_processes})
    else:  # the ceiling CreateOptimizationJob checked, against the GPUs placed here
        check_train_processes(options.train_processes, len(gpus), job.DeploymentInstanceType)
    sources = resolve_sources(job, model)
    store = AccountStore(make_store(ctx.settings), ref.account_id)
    pipeline = Pipeline(name, job, options, sources, store, work_dir(ctx, ref), control,
                        ctx.children_dir, ref.local_key,
                        _job_gpus(ctx, job, gpus),
                        compute_budget=compute_budget(ctx.settings.max_compute_processes),
                        max_stored_bytes=ctx.settings.max_stored_bytes,
                        kernels_dir=ctx.kernels_dir, vllm_module=ctx.settings.vllm_module)
    result = pipeline.run()
    backend = result.backend or serving_backend(options.backend, model)
    output = {"OptimizationOutput": {"RecommendedInferenceImage": backend},
              "ArtifactUri": result.output_uri, "HeadUri": result.head_uri, "Head": result.head,
              "Train": result.train, "Benchmark": result.benchmark}
    target = job.OutputConfig.SageMakerModel
    if not (target and target.ModelName):
        return output, None
    return output, to_wire(_output_model(target.ModelName, job, model, sources.model_uri,
                                         result.head_uri, result.schedule, backend,
                                         HEADS[result.head].default_mode))


def _job_gpus(ctx: WorkerContext, job: CreateOptimizationJobRequest,
              gpus: list[int]) -> placing.JobGpus:
    """The GPUs the job holds, with its instance type's memory and compute capability."""
    try:
        itype = lookup(job.DeploymentInstanceType)
    except UnsupportedInstanceType:
        return placing.JobGpus(gpus, ctx.placer.visible(gpus))
    return placing.JobGpus(gpus, ctx.placer.visible(gpus), itype.memory_gib,
                           itype.compute_capability)


def serving_backend(chosen: str | None, source: CreateModelInput | None) -> str:
    """The backend a job's output serves with when the job did not benchmark: the job's
    EAGLENEST_SERVING_BACKEND, else its source model container's, else this worker's default
    (vllm when installed, else embedded)."""
    if chosen:
        return chosen
    env = (model_container(source).Environment or {}) if source else {}
    return env.get(BACKEND_ENV) or default_backend()


def _output_model(name: str, job: CreateOptimizationJobRequest, source: CreateModelInput | None,
                  model_uri: str, head_uri: str, schedule: str | None,
                  backend: str, mode: str) -> CreateModelInput:
    """The CreateModel request of the output model: the source model's container (or, for
    ModelSource.S3, a container of ``model_uri`` whose Image names `backend`, the one the
    job recommends) plus the head as AdditionalModelDataSources channel `eagle_model`
    (what SageMaker's optimized model looks like), in its Environment the decode mode the
    head is trained and benchmarked for (`mode`: its kind's HeadSpec.default_mode; e.g. a
    block head cannot draft a chain) and, when the job benchmarked, the speculation
    schedule and the backend it was measured on (EAGLENEST_SERVING_BACKEND). Registered by
    _complete, in the transaction that completes the job."""
    if source:
        container = model_container(source)
        role = source.ExecutionRoleArn or job.RoleArn
    else:
        container = ContainerDefinition(Image=backend, ModelDataSource=ModelDataSource(
            S3DataSource=_s3_prefix(model_uri)))
        role = job.RoleArn
    extras = [e for e in container.AdditionalModelDataSources or []
              if e.ChannelName != EAGLE_CHANNEL]
    extras.append(AdditionalModelDataSource(ChannelName=EAGLE_CHANNEL,
                                            S3DataSource=_s3_prefix(head_uri)))
    env = {**(container.Environment or {}), MODE_ENV: str(mode)}
    if schedule is not None:  # the job benchmarked, on `backend`
        env.update({SCHEDULE_ENV: schedule, BACKEND_ENV: backend})
    update: dict[str, Any] = {"AdditionalModelDataSources": extras, "Environment": env}
    container = container.model_copy(update=update)
    return CreateModelInput(ModelName=name, ExecutionRoleArn=role, PrimaryContainer=container)


def _s3_prefix(uri: str) -> S3ModelDataSource:
    return S3ModelDataSource(S3Uri=uri, S3DataType="S3Prefix", CompressionType="None")


def _fail(ctx: WorkerContext, ref: ResourceRef, reason: str) -> str:
    log.warning("job %s FAILED: %s", ref.name, reason)
    with ctx.db.session() as s:
        if not jobs.fail(s, ref.arn, ctx.owner, reason):
            return "lease-lost"
    return jobs.FAILED


def _stopped(ctx: WorkerContext, ref: ResourceRef, reason: str, max_runtime: int | None) -> str:
    if reason == "max-runtime":
        return _fail(ctx, ref, f"The job ran longer than StoppingCondition.MaxRuntimeInSeconds "
                               f"({max_runtime} s) and was stopped.")
    if reason == "shutdown":
        with ctx.db.session() as s:
            released = jobs.release(s, ref.arn, ctx.owner)
        if released:
            log.warning("job %s handed back at shutdown; it resumes from its checkpoint",
                        ref.name)
            ctx.queue.send(OPTIMIZE_TASK, ref.arn, TRAIN_QUEUE)
        return "released"
    if reason == "stopped":
        with ctx.db.session() as s:
            if not jobs.acknowledge_stop(s, ref.arn, ctx.owner):
                return "lease-lost"
        shutil.rmtree(work_dir(ctx, ref), ignore_errors=True)
        return jobs.STOPPED
    return "deleted"


def register_tasks(app: Celery, ctx: WorkerContext) -> None:
    """The optimization task on `app` (routed to queue `train`,
    workers/infra/celery_app.py), running with `ctx`."""
    @app.task(name=OPTIMIZE_TASK, acks_late=True, reject_on_worker_lost=True)
    def optimize(ref: str) -> str:
        return run_job(ctx, ref)
