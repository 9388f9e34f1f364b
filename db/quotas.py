"""Per-account quotas (ResourceLimitExceeded, in the words SageMaker uses for its account
quotas): what an account holds (endpoints' instances and GPUs, jobs not yet ended) and what
it keeps (models, endpoint configurations, endpoints, optimization jobs of any status).

Every instance is a whole model server process on a serving host and every job a training
run, so a key holder must not be able to start an unbounded number of them, nor hold every
GPU of a shared fleet, nor fill the database with rows. What each counts:
- instances: an endpoint's model servers, and for each job not yet ended one instance per
  GPU of its DeploymentInstanceType or per training process (EAGLENEST_TRAIN_PROCESSES),
  whichever is more (foundation/host/ceilings.py job_instances);
- GPUs: each endpoint instance holds the GPUs of its variant's InstanceType, each job not
  yet ended those of its DeploymentInstanceType (foundation/instance_types.py; a CPU type or
  a serverless variant: none);
- while an UpdateEndpoint is pending an endpoint holds the larger of its old and new fleet;
- kept: rows of the account, whatever their status (a Failed endpoint, a COMPLETED job).
The limits are settings (docs/configuration.md; ``unlimited``: None, no check); each check
counts the caller's account only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from eaglenest.db.endpoint_retention import PENDING_OVERRIDES
from eaglenest.db.repository import find
from eaglenest.db.tables import (
    Base,
    EndpointConfigRow,
    EndpointRow,
    ModelRow,
    OptimizationJobRow,
)
from eaglenest.foundation import instance_types
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.errors import ResourceLimitExceeded
from eaglenest.foundation.host.ceilings import job_instances
from eaglenest.foundation.settings import Settings


@dataclass(frozen=True)
class Limits:
    """The quotas of Settings (None: unlimited)."""

    endpoints: int | None
    instances: int | None
    jobs: int | None
    gpus: int | None = None
    models: int | None = None
    endpoint_configs: int | None = None
    jobs_kept: int | None = None

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(settings.max_endpoints, settings.max_instances,
                   settings.max_concurrent_optimization_jobs, settings.max_gpus,
                   settings.max_models, settings.max_endpoint_configs,
                   settings.max_optimization_jobs)


@dataclass(frozen=True)
class Held:
    """What an endpoint or a job holds against the account's quotas."""

    instances: int = 0
    gpus: int = 0

    def __add__(self, other: Held) -> Held:
        return Held(self.instances + other.instances, self.gpus + other.gpus)

    def larger(self, other: Held) -> Held:
        return Held(max(self.instances, other.instances), max(self.gpus, other.gpus))


#: job statuses that hold a training run (or are about to)
ACTIVE_JOBS = ("STARTING", "INPROGRESS", "STOPPING")
#: what the instance quota's message adds: jobs count too
INSTANCES_NOTE = (" Instances are endpoint instances plus, for each optimization job not yet "
                  "ended, its GPUs or training processes.")
GPUS_NOTE = (" GPUs are those of each endpoint instance's InstanceType and of each "
             "optimization job not yet ended's DeploymentInstanceType.")


def _exceeded(quota: str, limit: int, used: int, delta: int, unit: str,
              setting: str) -> ResourceLimitExceeded:
    return ResourceLimitExceeded(
        f"The account-level service limit '{quota}' is {limit} {unit}, with current "
        f"utilization of {used} {unit} and a request delta of {delta} {unit}. Ask the "
        f"operator to raise {setting}.")


def type_gpus(name: Any) -> int:
    """The GPUs of an instance type (0: none given, a CPU type, one no longer served)."""
    if not name:
        return 0
    try:
        return instance_types.lookup(str(name)).accelerators
    except instance_types.UnsupportedInstanceType:
        return 0


def config_held(config: dict[str, Any],
                overrides: dict[str, dict[str, Any]] | None = None) -> Held:
    """The model server processes an endpoint config runs (a serverless variant runs one),
    with UpdateEndpointWeightsAndCapacities' DesiredInstanceCount where set, and their GPUs."""
    overrides = overrides or {}
    total = Held()
    for key in ("ProductionVariants", "ShadowProductionVariants"):
        for v in config.get(key) or []:
            count = overrides.get(v["VariantName"], {}).get("DesiredInstanceCount")
            count = int(count or v.get("InitialInstanceCount") or 1)
            total += Held(count, count * type_gpus(v.get("InstanceType")))
    return total


def endpoint_held(session: Session, row: EndpointRow) -> Held:
    """What an endpoint holds: its config's fleet, a pending weights change included, and
    while an UpdateEndpoint is pending the larger of its old and its new fleet."""
    from eaglenest.db.endpoints_repo import effective_overrides

    config = find(session, EndpointConfigRow, row.config_name, account_id=row.account_id)
    held = config_held(config.spec, effective_overrides(row.spec)) if config else Held()
    if row.pending_config_name:
        new = find(session, EndpointConfigRow, row.pending_config_name,
                   account_id=row.account_id)
        if new is not None:
            held = held.larger(config_held(new.spec, row.spec.get(PENDING_OVERRIDES)))
    return held


def job_held(spec: dict[str, Any]) -> Held:
    """What a job holds (module docstring); an unknown type: its processes, no GPU."""
    gpus = type_gpus(spec.get("DeploymentInstanceType"))
    return Held(job_instances(spec.get("OptimizationEnvironment"), gpus), gpus)


def jobs_held(session: Session, account_id: str) -> Held:
    """What the account's jobs not yet ended hold."""
    specs = session.scalars(select(OptimizationJobRow.spec).where(
        OptimizationJobRow.status.in_(ACTIVE_JOBS),
        OptimizationJobRow.account_id == account_id))
    return sum((job_held(spec or {}) for spec in specs), Held())


def _kept(session: Session, table: type[Base], account: Account, limit: int | None,
          quota: str, unit: str, setting: str) -> None:
    """One more row of `table` for the account, within `limit` rows of any status."""
    if limit is None:
        return
    t: Any = table
    used = int(session.scalar(select(func.count()).select_from(table).where(
        t.account_id == account.account_id)) or 0)
    if used + 1 > limit:
        raise _exceeded(quota, limit, used, 1, unit, setting)


def check_new_model(session: Session, account: Account, limits: Limits) -> None:
    """CreateModel: one more model kept."""
    _kept(session, ModelRow, account, limits.models, "models", "Models",
          "EAGLENEST_MAX_MODELS")


def check_new_endpoint_config(session: Session, account: Account, limits: Limits) -> None:
    """CreateEndpointConfig: one more endpoint configuration kept."""
    _kept(session, EndpointConfigRow, account, limits.endpoint_configs,
          "endpoint configurations", "EndpointConfigs", "EAGLENEST_MAX_ENDPOINT_CONFIGS")


def check_new_endpoint(session: Session, account: Account, config: dict[str, Any],
                       limits: Limits) -> None:
    """CreateEndpoint: one more endpoint, and its config's instances and GPUs."""
    _kept(session, EndpointRow, account, limits.endpoints, "endpoints", "Endpoints",
          "EAGLENEST_MAX_ENDPOINTS")
    rows = list(session.scalars(select(EndpointRow).where(
        EndpointRow.account_id == account.account_id)))
    _check_held(session, account, rows, config_held(config), limits)


def check_endpoint_change(session: Session, account: Account, endpoint: EndpointRow,
                          config: dict[str, Any], overrides: dict[str, dict[str, Any]] | None,
                          limits: Limits) -> None:
    """UpdateEndpoint / UpdateEndpointWeightsAndCapacities: `endpoint` will run `config`
    with `overrides` instead of what it runs now."""
    others = [r for r in session.scalars(select(EndpointRow).where(
        EndpointRow.account_id == account.account_id)) if r.id != endpoint.id]
    _check_held(session, account, others, config_held(config, overrides), limits)


def check_new_job(session: Session, account: Account, spec: dict[str, Any],
                  limits: Limits) -> None:
    """CreateOptimizationJob: one more job kept and running, its instances and GPUs."""
    _kept(session, OptimizationJobRow, account, limits.jobs_kept, "optimization jobs",
          "Jobs", "EAGLENEST_MAX_OPTIMIZATION_JOBS")
    if limits.jobs is not None:
        used = int(session.scalar(select(func.count()).select_from(OptimizationJobRow).where(
            OptimizationJobRow.status.in_(ACTIVE_JOBS),
            OptimizationJobRow.account_id == account.account_id)) or 0)
        if used + 1 > limits.jobs:
            raise _exceeded("concurrent optimization jobs", limits.jobs, used, 1, "Jobs",
                            "EAGLENEST_MAX_CONCURRENT_OPTIMIZATION_JOBS")
    rows = list(session.scalars(select(EndpointRow).where(
        EndpointRow.account_id == account.account_id)))
    _check_held(session, account, rows, job_held(spec), limits)


def _check_held(session: Session, account: Account, rows: list[EndpointRow],
                delta: Held, limits: Limits) -> None:
    """`delta` more beside the endpoints `rows` and the account's jobs not yet ended."""
    used = sum((endpoint_held(session, r) for r in rows), Held())
    used += jobs_held(session, account.account_id)
    if limits.instances is not None and used.instances + delta.instances > limits.instances:
        exc = _exceeded("instances across all endpoints", limits.instances, used.instances,
                        delta.instances, "Instances", "EAGLENEST_MAX_INSTANCES")
        raise ResourceLimitExceeded(exc.message + INSTANCES_NOTE)
    if (limits.gpus is not None and delta.gpus > 0
            and used.gpus + delta.gpus > limits.gpus):
        exc = _exceeded("GPUs across all endpoints and optimization jobs", limits.gpus,
                        used.gpus, delta.gpus, "GPUs", "EAGLENEST_MAX_GPUS")
        raise ResourceLimitExceeded(exc.message + GPUS_NOTE)
