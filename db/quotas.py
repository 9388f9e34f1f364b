"""Per-account quotas (ResourceLimitExceeded, in the words SageMaker uses for its account
quotas): endpoints, instances across all endpoints and jobs, concurrent optimization jobs.

Every instance is a whole model server process on a serving host and every job a training
run, so a key holder must not be able to start an unbounded number of them. The instance
quota counts what runs: an endpoint's model servers, and for each job not yet ended one
instance per GPU of its DeploymentInstanceType or per training process
(EAGLENEST_TRAIN_PROCESSES), whichever is more (foundation/limits.py job_instances). The
limits are settings (README's configuration table); each check counts the caller's
account only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from eaglenest.db.common import find
from eaglenest.db.endpoint_retention import PENDING_OVERRIDES
from eaglenest.db.tables import EndpointConfigRow, EndpointRow, OptimizationJobRow
from eaglenest.foundation import instance_types
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.errors import ResourceLimitExceeded
from eaglenest.foundation.limits import job_instances
from eaglenest.foundation.settings import Settings


@dataclass(frozen=True)
class Limits:
    endpoints: int
    instances: int
    jobs: int

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(settings.max_endpoints, settings.max_instances,
                   settings.max_concurrent_optimization_jobs)


#: job statuses that hold a training run (or are about to)
ACTIVE_JOBS = ("STARTING", "INPROGRESS", "STOPPING")
#: what the instance quota's message adds: jobs count too
INSTANCES_NOTE = (" Instances are endpoint instances plus, for each optimization job not yet "
                  "ended, its GPUs or training processes.")


def _exceeded(quota: str, limit: int, used: int, delta: int, unit: str,
              setting: str) -> ResourceLimitExceeded:
    return ResourceLimitExceeded(
        f"The account-level service limit '{quota}' is {limit} {unit}, with current "
        f"utilization of {used} {unit} and a request delta of {delta} {unit}. Ask the "
        f"operator to raise {setting}.")


def config_instances(config: dict[str, Any],
                     overrides: dict[str, dict[str, Any]] | None = None) -> int:
    """Model server processes an endpoint config runs (a serverless variant runs one),
    with UpdateEndpointWeightsAndCapacities' DesiredInstanceCount where set."""
    overrides = overrides or {}
    total = 0
    for key in ("ProductionVariants", "ShadowProductionVariants"):
        for v in config.get(key) or []:
            count = overrides.get(v["VariantName"], {}).get("DesiredInstanceCount")
            total += int(count or v.get("InitialInstanceCount") or 1)
    return total


def endpoint_instances(session: Session, row: EndpointRow) -> int:
    """The instances an endpoint holds: its config's, a pending weights change included,
    and while an UpdateEndpoint is pending the larger of its old and its new fleet."""
    from eaglenest.db.endpoints_repo import effective_overrides

    config = find(session, EndpointConfigRow, row.config_name, account_id=row.account_id)
    held = config_instances(config.spec, effective_overrides(row.spec)) if config else 0
    if row.pending_config_name:
        new = find(session, EndpointConfigRow, row.pending_config_name,
                   account_id=row.account_id)
        if new is not None:
            held = max(held, config_instances(new.spec, row.spec.get(PENDING_OVERRIDES)))
    return held


def spec_instances(spec: dict[str, Any]) -> int:
    """The instances a job holds (module docstring); an unknown type: its processes."""
    try:
        gpus = instance_types.lookup(str(spec.get("DeploymentInstanceType"))).accelerators
    except instance_types.UnsupportedInstanceType:
        gpus = 0
    return job_instances(spec.get("OptimizationEnvironment"), gpus)


def job_instances_held(session: Session, account_id: str) -> int:
    """The instances the account's jobs not yet ended hold."""
    specs = session.scalars(select(OptimizationJobRow.spec).where(
        OptimizationJobRow.status.in_(ACTIVE_JOBS),
        OptimizationJobRow.account_id == account_id))
    return sum(spec_instances(spec or {}) for spec in specs)


def check_new_endpoint(session: Session, account: Account, config: dict[str, Any],
                       max_endpoints: int, max_instances: int) -> None:
    """CreateEndpoint: one more endpoint, and its config's instances."""
    rows = list(session.scalars(select(EndpointRow).where(
        EndpointRow.account_id == account.account_id)))
    if len(rows) + 1 > max_endpoints:
        raise _exceeded("endpoints", max_endpoints, len(rows), 1, "Endpoints",
                        "EAGLENEST_MAX_ENDPOINTS")
    _check_instances(session, account, rows, config_instances(config), max_instances)


def check_instances(session: Session, account: Account, endpoint: EndpointRow, new_count: int,
                    max_instances: int) -> None:
    """UpdateEndpoint / UpdateEndpointWeightsAndCapacities: `endpoint` will run
    `new_count` instances instead of what it runs now."""
    others = [r for r in session.scalars(select(EndpointRow).where(
        EndpointRow.account_id == account.account_id)) if r.id != endpoint.id]
    _check_instances(session, account, others, new_count, max_instances)


def check_job_instances(session: Session, account: Account, spec: dict[str, Any],
                        max_instances: int) -> None:
    """CreateOptimizationJob: the job's GPUs or training processes, as instances."""
    rows = list(session.scalars(select(EndpointRow).where(
        EndpointRow.account_id == account.account_id)))
    _check_instances(session, account, rows, spec_instances(spec), max_instances)


def _check_instances(session: Session, account: Account, rows: list[EndpointRow],
                     delta: int, limit: int) -> None:
    """`delta` more instances beside the endpoints `rows` and the account's jobs."""
    used = sum(endpoint_instances(session, r) for r in rows)
    used += job_instances_held(session, account.account_id)
    if used + delta > limit:
        exc = _exceeded("instances across all endpoints", limit, used, delta, "Instances",
                        "EAGLENEST_MAX_INSTANCES")
        raise ResourceLimitExceeded(exc.message + INSTANCES_NOTE)


def check_new_job(session: Session, account: Account, limit: int) -> None:
    """CreateOptimizationJob: one more concurrent job."""
    stmt = select(func.count()).select_from(OptimizationJobRow).where(
        OptimizationJobRow.status.in_(ACTIVE_JOBS),
        OptimizationJobRow.account_id == account.account_id)
    used = int(session.scalar(stmt) or 0)
    if used + 1 > limit:
        raise _exceeded("concurrent optimization jobs", limit, used, 1, "Jobs",
                        "EAGLENEST_MAX_CONCURRENT_OPTIMIZATION_JOBS")
