"""Optimization jobs and their lifecycle: the one place where a job changes status.

    STARTING --claim--> INPROGRESS --complete--> COMPLETED
    STARTING/INPROGRESS --fail--> FAILED
    STARTING/INPROGRESS --request_stop--> STOPPING --acknowledge_stop--> STOPPED
    STARTING (no worker owns it) --request_stop--> STOPPED at once

A job is "owned" by a worker while that worker heartbeats it; an owner silent for longer
than `lease_seconds` is presumed dead (see `reclaim_lost`). Only the owner ends a running
job (`complete`, `fail`, `acknowledge_stop` take the owner and change nothing otherwise):
a worker that lost its lease while paused cannot finish a job another worker now runs.

The API calls create / get / request_* by the caller's account and a name; workers call the
others by the job's ARN (`ref`: db/repository.locate).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from eaglenest.db import gpu_fit, models_repo, quotas, repository, tags_repo
from eaglenest.db.repository import (
    checked_claims,
    failure_reason,
    find,
    insert_claiming,
    locate,
    new_row,
    now,
)
from eaglenest.db.tables import ModelRow, OptimizationJobRow
from eaglenest.foundation import environment, instance_types, job_options
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.errors import ResourceInUse, ResourceNotFound, ValidationException
from eaglenest.foundation.host.ceilings import host_cpus
from eaglenest.foundation.shapes.shared import Tag
from eaglenest.foundation.store.storage import BucketStore

STARTING, INPROGRESS, COMPLETED = "STARTING", "INPROGRESS", "COMPLETED"
FAILED, STOPPING, STOPPED = "FAILED", "STOPPING", "STOPPED"
ACTIVE = (STARTING, INPROGRESS, STOPPING)
TERMINAL = (COMPLETED, FAILED, STOPPED)

#: botocore's OptimizationConfig member -> the optimization type a summary lists
OPTIMIZATION_TYPES = {
    "ModelSpeculativeDecodingConfig": "SpeculativeDecoding",
    "ModelQuantizationConfig": "Quantization",
    "ModelCompilationConfig": "Compilation",
    "ModelShardingConfig": "Sharding",
}
SUPPORTED = ("ModelSpeculativeDecodingConfig",)


def not_found(name: str) -> ResourceNotFound:
    return ResourceNotFound(f"Optimization job {name} does not exist.")


def _check_environment(spec: dict[str, Any]) -> None:
    """Only allowed variables are accepted (foundation/environment.py)."""
    envs = [("OptimizationEnvironment", spec.get("OptimizationEnvironment"))]
    for i, config in enumerate(spec.get("OptimizationConfigs") or [], start=1):
        for member, body in config.items():
            if isinstance(body, dict) and "OverrideEnvironment" in body:
                envs.append((f"OptimizationConfigs.{i}.{member}.OverrideEnvironment",
                             body["OverrideEnvironment"]))
    try:
        for where, env in envs:
            environment.check(env, where)
    except environment.EnvironmentRejected as exc:
        raise ValidationException(str(exc)) from None


def _check_instance_type(spec: dict[str, Any]) -> None:
    """DeploymentInstanceType is one EagleNest serves (foundation/instance_types.py)."""
    try:
        instance_types.lookup(spec["DeploymentInstanceType"])
    except instance_types.UnsupportedInstanceType as exc:
        raise ValidationException(f"DeploymentInstanceType {exc}") from None


def _check_options(spec: dict[str, Any]) -> None:
    """The job's options as the worker parses them, and within what its type holds
    (foundation/job_options.py check_create): training processes and EAGLENEST_DEVICE=cuda
    against the GPUs of its DeploymentInstanceType, thread counts the API host's CPUs."""
    itype = spec["DeploymentInstanceType"]
    try:
        job_options.check_create(spec.get("OptimizationEnvironment"), "OptimizationEnvironment",
                                 host_cpus(), instance_types.lookup(itype).accelerators, itype)
    except job_options.OptionError as exc:
        raise ValidationException(str(exc)) from None


def _check_spec(session: Session, account: Account, spec: dict[str, Any]) -> list[str]:
    source = spec["ModelSource"]
    if not source.get("S3") and not source.get("SageMakerModel"):
        raise ValidationException(
            "ModelSource must specify either S3 (S3Uri of the model artifacts) or SageMakerModel."
        )
    sm_model = source.get("SageMakerModel")
    if sm_model and find(session, ModelRow, sm_model["ModelName"],
                         account_id=account.account_id) is None:
        raise models_repo.not_found(account, sm_model["ModelName"])
    output = (spec["OutputConfig"].get("SageMakerModel") or {}).get("ModelName")
    if output and find(session, ModelRow, output, account_id=account.account_id) is not None:
        raise ValidationException(
            f"OutputConfig.SageMakerModel.ModelName: cannot create already existing model "
            f'"{account.arn("model", output)}"; name a model that does not exist yet.'
        )
    types: list[str] = []
    for i, config in enumerate(spec["OptimizationConfigs"], start=1):
        (member,) = config.keys()  # the shape guarantees exactly one member
        if member not in SUPPORTED:
            raise ValidationException(
                f"OptimizationConfigs.{i}.{member} is not supported by EagleNest: "
                f"only ModelSpeculativeDecodingConfig (Technique EAGLE) is."
            )
        types.append(OPTIMIZATION_TYPES[member])
    _check_environment(spec)
    _check_instance_type(spec)
    _check_options(spec)
    return sorted(set(types))


def create(session: Session, account: Account, spec: dict[str, Any],
           limits: quotas.Limits | None = None,
           store: BucketStore | None = None,
           tags: Sequence[Tag] = ()) -> OptimizationJobRow:
    """With `store` (the API: always), every bucket the request names (model, data, head,
    output) must be the account's, or nobody's and the caller the default account (any
    caller for the output); the output bucket becomes the account's (db/bucket_claims.py). The
    OptimizationEnvironment's server options, and with `store` the fit of the job's
    benchmark server on its DeploymentInstanceType's GPUs (db/gpu_fit.py), are checked
    before the row is written."""
    types = _check_spec(session, account, spec)
    if limits is not None:
        quotas.check_new_job(session, account, spec, limits)
    name = spec["OptimizationJobName"]
    stored_tags = tags_repo.check_new_tags(tags)
    refs = checked_claims(store, account, spec)
    gpu_fit.check_job(session, account, spec, store)
    row = new_row(OptimizationJobRow, account, "optimization-job", name, spec, stored_tags,
                  modified=True, status=STARTING, optimization_types=",".join(types),
                  output={})
    duplicate = ResourceInUse(f"Optimization job {name} already exists.")
    return insert_claiming(session, row, duplicate, account, store, refs)


def get(session: Session, name: str, *, lock: bool = False,
        account: Account | None = None) -> OptimizationJobRow:
    """The API's: `account`'s job named `name`. Without `account` (a worker's), the job
    `name` refers to as db/repository.locate reads it (its ARN)."""
    if account is not None:
        row = find(session, OptimizationJobRow, name, lock=lock, account_id=account.account_id)
    else:
        row = locate(session, OptimizationJobRow, name, lock=lock)
    if row is None:
        raise not_found(name)
    return row


def _set(row: OptimizationJobRow, status: str, reason: str | None = None) -> None:
    t = now()
    row.status = status
    row.last_modified_time = t
    if reason is not None:
        row.failure_reason = failure_reason(reason, row.arn)
    if status in TERMINAL:
        row.end_time = t
        row.owner = None


def owner_alive(row: OptimizationJobRow, lease_seconds: float) -> bool:
    return bool(row.owner and row.heartbeat_time and now() - row.heartbeat_time < lease_seconds)


def request_stop(session: Session, name: str, lease_seconds: float,
                 account: Account | None = None) -> None:
    row = get(session, name, lock=True, account=account)
    if row.status in TERMINAL or row.status == STOPPING:
        raise ValidationException(
            f"Optimization job {name} is {row.status} and cannot be stopped: only jobs that "
            f"are {STARTING} or {INPROGRESS} can be."
        )
    _set(row, STOPPING if owner_alive(row, lease_seconds) else STOPPED)


def request_delete(session: Session, name: str, lease_seconds: float,
                   account: Account | None = None) -> None:
    row = get(session, name, lock=True, account=account)
    if row.status in (INPROGRESS, STOPPING) and owner_alive(row, lease_seconds):
        raise ValidationException(
            f"Optimization job {name} is {row.status}: stop it with StopOptimizationJob and "
            f"wait for {STOPPED} before deleting it."
        )
    session.delete(row)


def claim(session: Session, ref: str, owner: str) -> OptimizationJobRow | None:
    """Worker side: take a STARTING job. None if it is gone, stopped or owned elsewhere."""
    row = locate(session, OptimizationJobRow, ref, lock=True)
    if row is None or row.status != STARTING:
        return None
    # Compare-and-set: SQLite ignores FOR UPDATE, so two deliveries of the same job (a
    # re-send plus the start-up reconcile) could both read STARTING; only one UPDATE of a
    # row still STARTING can match.
    t = now()
    won = session.execute(
        update(OptimizationJobRow)
        .where(OptimizationJobRow.id == row.id, OptimizationJobRow.status == STARTING)
        .values(status=INPROGRESS, owner=owner, heartbeat_time=t, start_time=t,
                last_modified_time=t)
        .execution_options(synchronize_session=False)
    )
    if won.rowcount != 1:  # type: ignore[attr-defined]
        return None
    session.refresh(row)
    return row


def heartbeat(session: Session, ref: str, owner: str) -> str | None:
    """Refresh the lease; return the job's status (None if deleted or not ours)."""
    return repository.heartbeat(session, OptimizationJobRow, ref, owner)


def record_progress(session: Session, ref: str, owner: str, progress: dict[str, Any]) -> bool:
    """Worker side: the running job's stage and training progress (`eaglenest status`).
    Changes neither status nor LastModifiedTime; False if the job is not ours or not running."""
    row = locate(session, OptimizationJobRow, ref)
    if row is None or row.owner != owner or row.status not in (INPROGRESS, STOPPING):
        return False
    row.progress = progress
    return True


def _owned(session: Session, ref: str, owner: str,
           statuses: tuple[str, ...]) -> OptimizationJobRow | None:
    row = locate(session, OptimizationJobRow, ref, lock=True)
    if row is None or row.owner != owner or row.status not in statuses:
        return None
    return row


def complete(session: Session, ref: str, owner: str, output: dict[str, Any]) -> bool:
    """INPROGRESS -> COMPLETED by its owner; False (nothing changed) for anyone else."""
    row = _owned(session, ref, owner, (INPROGRESS,))
    if row is None:
        return False
    row.output = output
    _set(row, COMPLETED)
    return True


def fail(session: Session, ref: str, owner: str, reason: str) -> bool:
    """INPROGRESS -> FAILED by its owner; False (nothing changed) for anyone else."""
    row = _owned(session, ref, owner, (INPROGRESS,))
    if row is None:
        return False
    _set(row, FAILED, reason)
    return True


def acknowledge_stop(session: Session, ref: str, owner: str) -> bool:
    row = _owned(session, ref, owner, (STOPPING,))
    if row is None:
        return False
    _set(row, STOPPED)
    return True


def release(session: Session, ref: str, owner: str) -> bool:
    """A worker shutting down hands its job back: INPROGRESS -> STARTING (resumed from its
    checkpoint by the next worker). False if the job is not ours or not running."""
    row = locate(session, OptimizationJobRow, ref, lock=True)
    if row is None or row.owner != owner or row.status != INPROGRESS:
        return False
    row.owner, row.heartbeat_time = None, None
    _set(row, STARTING)
    return True


def stale_starting(session: Session, older_than: float) -> list[str]:
    """The ARNs of STARTING jobs untouched for `older_than` seconds (their message may
    have been lost)."""
    stmt = select(OptimizationJobRow.arn).where(
        OptimizationJobRow.status == STARTING,
        OptimizationJobRow.last_modified_time < now() - older_than,
    )
    return sorted(session.scalars(stmt))


def pending(session: Session) -> list[str]:
    """The ARN of every STARTING job (re-enqueued by a worker that starts)."""
    stmt = select(OptimizationJobRow.arn).where(OptimizationJobRow.status == STARTING)
    return sorted(session.scalars(stmt))


def reclaim_lost(session: Session, lease_seconds: float) -> list[str]:
    """Jobs whose owner stopped heartbeating: STOPPING ones become STOPPED, INPROGRESS ones
    go back to STARTING so the next worker resumes them. Returns the reclaimed ARNs."""
    cutoff = now() - lease_seconds
    stmt = select(OptimizationJobRow).where(
        OptimizationJobRow.status.in_((INPROGRESS, STOPPING)),
        (OptimizationJobRow.heartbeat_time.is_(None))
        | (OptimizationJobRow.heartbeat_time < cutoff),
    )
    arns = []
    for row in session.scalars(stmt.with_for_update()):
        if row.status == STOPPING:
            _set(row, STOPPED)
            continue
        row.owner, row.heartbeat_time = None, None
        _set(row, STARTING)
        arns.append(row.arn)
    return sorted(arns)
