"""Endpoints and their lifecycle: the one place where an endpoint changes status.

    Creating --mark_in_service--> InService --request_update--> Updating
    Creating --mark_failed------> Failed      Updating --finish_update--> InService
    any ------request_delete----> Deleting (or gone at once if nothing is deployed)
    Deleting --finish_delete----> (row removed)
    Updating --rollback_update--> InService (old config kept, FailureReason set)
    Updating --shift_traffic--> Updating (a blue/green step: a share of traffic on the new fleet)
    InService --request_weights--> Updating --finish_weights / rollback_weights--> InService
    InService --begin_recovery--> SystemUpdating --finish_recovery--> InService / Failed
    Creating/SystemUpdating/Deleting --time_out--> Failed;  Updating --time_out--> InService

Transitional statuses (Creating, Updating, Deleting, SystemUpdating) are worked on by one
worker at a time: `claim` makes it the row's owner, `heartbeat` keeps it so; an owner silent
for a lease is presumed dead and the task is sent again (workers/infra/reconcile.py). Every status
change clears the owner. No endpoint stays transitional longer than the worker's
EAGLENEST_ENDPOINT_TRANSITION_SECONDS: `time_out` ends it with a FailureReason.

The web layer calls the request_* functions, by the caller's account and a name; serving
workers call the others by the endpoint's ARN (`ref`: db/repository.locate).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from eaglenest.db import (
    endpoint_configs_repo,
    gpu_fit,
    quotas,
    repository,
    tags_repo,
    traffic_policy,
)
from eaglenest.db import endpoint_retention as retention
from eaglenest.db.endpoint_spread import drop_placing, next_deployment, settled
from eaglenest.db.repository import failure_reason, find, get_named, insert_unique, locate, now
from eaglenest.db.tables import EndpointConfigRow, EndpointRow
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.errors import ResourceLimitExceeded, ValidationException
from eaglenest.foundation.shapes.shared import Tag
from eaglenest.foundation.store.storage import BucketStore

CREATING, IN_SERVICE, UPDATING = "Creating", "InService", "Updating"
DELETING, FAILED = "Deleting", "Failed"
SYSTEM_UPDATING = "SystemUpdating"
TRANSITIONAL = (CREATING, UPDATING, DELETING, SYSTEM_UPDATING)


def not_found(account: Account, name: str) -> ValidationException:
    return ValidationException(f'Could not find endpoint "{account.arn("endpoint", name)}".')


def create(session: Session, account: Account, spec: dict[str, Any],
           limits: quotas.Limits | None = None,
           store: BucketStore | None = None, tags: Sequence[Tag] = ()) -> EndpointRow:
    """CreateEndpoint: the config's variants' options, and with `store` (the API: always)
    their fit on their GPU types (db/gpu_fit.py), are checked before the row is written."""
    config = endpoint_configs_repo.get(session, account, spec["EndpointConfigName"])
    if limits is not None:
        quotas.check_new_endpoint(session, account, config.spec, limits)
    name = spec["EndpointName"]
    stored_tags = tags_repo.check_new_tags(tags)
    gpu_fit.check_endpoint_config(session, account, config.spec, store)
    row = repository.new_row(EndpointRow, account, "endpoint", name, spec, stored_tags,
                             modified=True, status=CREATING, config_name=config.name,
                             deployment={})
    duplicate = ValidationException(f'Cannot create already existing endpoint "{row.arn}".')
    insert_unique(session, row, duplicate)
    return row


def get(session: Session, account: Account, name: str, *, lock: bool = False) -> EndpointRow:
    return get_named(session, EndpointRow, account, name, not_found, lock=lock)


def config_spec(session: Session, row: EndpointRow) -> dict[str, Any] | None:
    """The request of the endpoint config the endpoint runs (None: deleted since)."""
    config = find(session, EndpointConfigRow, row.config_name, account_id=row.account_id)
    return config.spec if config is not None else None


def _set(row: EndpointRow, status: str, reason: str | None = None) -> None:
    row.status = status
    row.failure_reason = failure_reason(reason, row.arn)
    row.last_modified_time = now()
    row.owner, row.heartbeat_time = None, None


def _require_in_service(row: EndpointRow) -> None:
    if row.status != IN_SERVICE:
        raise ValidationException(
            f'Cannot update endpoint "{row.arn}" while it is {row.status}: '
            f"an endpoint can be updated only when its status is {IN_SERVICE}."
        )


def request_update(
    session: Session, account: Account, name: str, config_name: str, spec: dict[str, Any],
    limits: quotas.Limits | None = None, store: BucketStore | None = None,
) -> EndpointRow:
    """UpdateEndpoint: the new config, what is retained of the running endpoint
    (db.endpoint_retention) and the deployment configuration, pending until a worker has
    the new fleet serving. The new config's variants are checked as CreateEndpoint checks
    them (db/gpu_fit.py) before anything changes."""
    row = get(session, account, name, lock=True)
    config = endpoint_configs_repo.get(session, account, config_name)
    deploy_config = retention.deployment_config(row.spec, spec)
    old = find(session, EndpointConfigRow, row.config_name, account_id=row.account_id)
    pending = retention.retained(row.spec, row.deployment, old.spec if old else None,
                                 config.spec, spec)
    traffic_policy.check(spec.get(retention.DEPLOYMENT_CONFIG),
                         _fleet_size(config.spec, pending[retention.PENDING_OVERRIDES]))
    _require_in_service(row)
    if limits is not None:
        quotas.check_endpoint_change(session, account, row, config.spec,
                                     pending.get(retention.PENDING_OVERRIDES), limits)
    gpu_fit.check_endpoint_config(session, account, config.spec, store)
    new_spec = {k: v for k, v in row.spec.items() if k != retention.DEPLOYMENT_CONFIG}
    if deploy_config is not None:
        new_spec[retention.DEPLOYMENT_CONFIG] = deploy_config
    row.pending_config_name = config.name
    row.spec = {**new_spec, "PendingUpdate": spec, **pending}
    _set(row, UPDATING)
    return row


def _fleet_size(config_spec: dict[str, Any], overrides: dict[str, dict[str, Any]]) -> int:
    """The instances a config's fleet runs, retained counts included."""
    return sum(int(overrides.get(v["VariantName"], {}).get(
        "DesiredInstanceCount", v.get("InitialInstanceCount") or 1))
        for v in config_spec["ProductionVariants"])


#: deployment key while a blue/green update shifts traffic: the new fleet's record
#: ("Servers", "ProductionVariants"), its "Fraction" of the traffic and the step's "Status"
SHIFT = "Shift"


def shift_traffic(session: Session, ref: str, new: dict[str, Any], fraction: float,
                  message: str) -> bool:
    """A blue/green step: `fraction` of the traffic goes to the new fleet (`new`, its
    deployment record) and the rest to the old one; the endpoint stays Updating. False if
    it no longer is (deleted, rolled back, timed out): the caller stops the new fleet."""
    row = locate(session, EndpointRow, ref, lock=True)
    if row is None or row.status != UPDATING or not row.pending_config_name:
        return False
    status = {"Status": "Baking", "StatusMessage": message, "StartTime": now()}
    row.deployment = {**row.deployment, SHIFT: {
        "Servers": new["Servers"], "ProductionVariants": new["ProductionVariants"],
        "Fraction": fraction, "Status": status}}
    return True


def updating_to(session: Session, ref: str, config_name: str) -> bool:
    """Whether the endpoint is still Updating to `config_name` (a worker's update goes on)."""
    row = locate(session, EndpointRow, ref)
    return row is not None and row.status == UPDATING and row.pending_config_name == config_name


#: spec keys: variant -> {"DesiredWeight", "DesiredInstanceCount"} in force (set by
#: UpdateEndpointWeightsAndCapacities, kept or dropped by UpdateEndpoint), and pending
OVERRIDES, PENDING_WEIGHTS = retention.OVERRIDES, "PendingWeights"


def effective_overrides(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per variant, the weight and instance count that replace the endpoint config's
    InitialVariantWeight / InitialInstanceCount, a pending change included."""
    out = {v: dict(o) for v, o in (spec.get(OVERRIDES) or {}).items()}
    for variant, change in (spec.get(PENDING_WEIGHTS) or {}).items():
        out.setdefault(variant, {}).update(change)
    return out


def _check_desired(row: EndpointRow, desired: list[dict[str, Any]], max_instances: int) -> None:
    names = [d["VariantName"] for d in desired]
    for n in names:
        if names.count(n) > 1:
            raise ValidationException(f'The variant name "{n}" was non-unique within the request.')
    _require_in_service(row)
    present = {v["VariantName"] for v in row.deployment.get("ProductionVariants") or []}
    missing = [n for n in names if n not in present]
    if missing:
        raise ValidationException(
            f'The variant name(s) "{", ".join(missing)}" is/are not present within endpoint '
            f'configuration "{row.config_name}".')
    for d in desired:
        if "ServerlessUpdateConfig" in d:
            raise ValidationException(
                f"Variant {d['VariantName']}: ServerlessUpdateConfig is not supported by "
                "EagleNest (a serverless variant runs as one instance).")
        count = d.get("DesiredInstanceCount")
        if count == 0:
            raise ValidationException(
                f"Variant {d['VariantName']}: DesiredInstanceCount must be at least 1 "
                "(scaling a variant to zero instances is not supported).")
        if count is not None and count > max_instances:
            raise ResourceLimitExceeded(
                f"Variant {d['VariantName']}: DesiredInstanceCount is {count}, but this "
                f"service runs at most {max_instances} instances (model server processes) "
                "per variant (EAGLENEST_MAX_INSTANCES_PER_VARIANT).")


def request_weights(session: Session, account: Account, name: str,
                    desired: list[dict[str, Any]], max_instances: int,
                    limits: quotas.Limits | None = None) -> EndpointRow:
    """UpdateEndpointWeightsAndCapacities: record the desired weights and counts (shown as
    Desired* at once; Current* follow when a worker has applied them) and go Updating."""
    row = get(session, account, name, lock=True)
    _check_desired(row, desired, max_instances)
    pending = {d["VariantName"]: {k: d[k] for k in ("DesiredWeight", "DesiredInstanceCount")
                                  if k in d} for d in desired}
    if limits is not None:
        after = effective_overrides({**row.spec, PENDING_WEIGHTS: pending})
        config = find(session, EndpointConfigRow, row.config_name,
                      account_id=row.account_id)
        quotas.check_endpoint_change(session, account, row, config.spec if config else {},
                                     after, limits)
    summaries = [{**v, **pending.get(v["VariantName"], {})}
                 for v in row.deployment["ProductionVariants"]]
    row.deployment = {**row.deployment, "ProductionVariants": summaries}
    row.spec = {**row.spec, PENDING_WEIGHTS: pending}
    _set(row, UPDATING)
    return row


def finish_weights(session: Session, ref: str, deployment: dict[str, Any]) -> bool:
    """False if the endpoint was deleted or changed meanwhile (the caller stops what it
    started)."""
    row = locate(session, EndpointRow, ref, lock=True)
    if row is None or row.status != UPDATING or PENDING_WEIGHTS not in row.spec:
        return False
    spec = {k: v for k, v in row.spec.items() if k != PENDING_WEIGHTS}
    row.spec = {**spec, OVERRIDES: effective_overrides(row.spec)}
    row.deployment = next_deployment(row.deployment, deployment)
    _set(row, IN_SERVICE)
    return True


def rollback_weights(session: Session, ref: str, reason: str) -> None:
    """The change could not be applied: Desired* back to Current*, InService, the reason
    in FailureReason."""
    row = locate(session, EndpointRow, ref, lock=True)
    if row is None or row.status != UPDATING or PENDING_WEIGHTS not in row.spec:
        return
    row.spec = {k: v for k, v in row.spec.items() if k != PENDING_WEIGHTS}
    row.deployment = {**row.deployment, "ProductionVariants": [
        {**v, "DesiredWeight": v["CurrentWeight"], "DesiredInstanceCount":
         v["CurrentInstanceCount"]} for v in row.deployment["ProductionVariants"]]}
    _set(row, IN_SERVICE, reason)


def request_delete(session: Session, account: Account, name: str) -> str | None:
    """The endpoint's ARN if a worker must stop serving processes (status Deleting); None
    when nothing was ever started and the row is gone already."""
    row = get(session, account, name, lock=True)
    if not row.deployment:  # nothing was ever started: nothing to tear down
        session.delete(row)
        return None
    _set(row, DELETING)
    return row.arn


def _serving(session: Session, ref: str, deployment: dict[str, Any], status: str) -> bool:
    """`status` -> InService with `deployment`; False if the endpoint was deleted or is no
    longer in `status` meanwhile: the caller must tear down."""
    row = locate(session, EndpointRow, ref, lock=True)
    if row is None or row.status != status:
        return False
    row.deployment = next_deployment(row.deployment, deployment)
    _set(row, IN_SERVICE)
    return True


def mark_in_service(session: Session, ref: str, deployment: dict[str, Any]) -> bool:
    return _serving(session, ref, deployment, CREATING)


def mark_failed(session: Session, ref: str, reason: str) -> None:
    row = locate(session, EndpointRow, ref, lock=True)
    if row is not None and row.status in (CREATING, IN_SERVICE, SYSTEM_UPDATING, DELETING):
        _set(row, FAILED, reason)


def begin_recovery(session: Session, ref: str, owner: str) -> bool:
    """A worker found an InService endpoint's processes dead and will restart them."""
    row = locate(session, EndpointRow, ref, lock=True)
    if row is None or row.status != IN_SERVICE:
        return False
    _set(row, SYSTEM_UPDATING)
    row.owner, row.heartbeat_time = owner, now()
    return True


def claim(session: Session, ref: str, status: str, owner: str, lease_seconds: float) -> bool:
    """Worker side: own the endpoint's `status` transition. False when it is in another
    status, gone, or owned by a worker that heartbeated within `lease_seconds`."""
    row = locate(session, EndpointRow, ref)
    if row is None:
        return False
    t = now()
    free = (EndpointRow.owner.is_(None) | (EndpointRow.owner == owner)
            | EndpointRow.heartbeat_time.is_(None)
            | (EndpointRow.heartbeat_time < t - lease_seconds))
    # compare-and-set (SQLite ignores FOR UPDATE): of two deliveries, one UPDATE matches
    won = session.execute(
        update(EndpointRow)
        .where(EndpointRow.id == row.id, EndpointRow.status == status, free)
        .values(owner=owner, heartbeat_time=t)
        .execution_options(synchronize_session=False))
    return bool(won.rowcount == 1)  # type: ignore[attr-defined]


def heartbeat(session: Session, ref: str, owner: str) -> str | None:
    """Refresh the owner's lease; the status, or None when gone or no longer ours."""
    return repository.heartbeat(session, EndpointRow, ref, owner)


def release(session: Session, ref: str, owner: str) -> None:
    """The owner's task ended without changing the status: the next task may claim it."""
    row = locate(session, EndpointRow, ref, lock=True)
    if row is not None and row.owner == owner:
        row.owner, row.heartbeat_time = None, None


def unattended(session: Session, lease_seconds: float) -> list[tuple[str, str]]:
    """(ARN, status) of transitional endpoints nobody works on: no owner for a lease since
    the status was set (its task message may be lost), or an owner silent for a lease."""
    cutoff = now() - lease_seconds
    stmt = select(EndpointRow.arn, EndpointRow.status).where(
        EndpointRow.status.in_(TRANSITIONAL),
        (EndpointRow.owner.is_(None) & (EndpointRow.last_modified_time < cutoff))
        | (EndpointRow.owner.is_not(None) & (EndpointRow.heartbeat_time < cutoff)))
    return [(n, st) for n, st in session.execute(stmt)]


def time_out(session: Session, bound_seconds: float) -> list[str]:
    """End every transition older than `bound_seconds`: an update rolls back to the config
    that serves, anything else becomes Failed; the reason says which bound. Their ARNs."""
    stmt = select(EndpointRow).where(EndpointRow.status.in_(TRANSITIONAL),
                                     EndpointRow.last_modified_time < now() - bound_seconds)
    arns = []
    for row in session.scalars(stmt.with_for_update()):
        why = (f"The endpoint stayed {row.status} longer than {bound_seconds:.0f} s "
               "(EAGLENEST_ENDPOINT_TRANSITION_SECONDS)")
        if row.status == UPDATING:
            _rollback(row, f"Update to {row.pending_config_name} failed and was rolled "
                           f"back: {why}.")
        else:
            _set(row, FAILED, f"{why}; it was marked Failed.")
        arns.append(row.arn)
    return arns


def finish_recovery(session: Session, ref: str, deployment: dict[str, Any]) -> bool:
    return _serving(session, ref, deployment, SYSTEM_UPDATING)


def finish_update(session: Session, ref: str, deployment: dict[str, Any]) -> bool:
    row = locate(session, EndpointRow, ref, lock=True)
    if row is None or row.status != UPDATING or not row.pending_config_name:
        return False
    row.config_name = row.pending_config_name
    row.pending_config_name = None
    row.deployment = next_deployment(row.deployment, deployment)
    row.spec = retention.settle(row.spec, applied=True)
    _set(row, IN_SERVICE)
    return True


def rollback_update(session: Session, ref: str, reason: str) -> None:
    row = locate(session, EndpointRow, ref, lock=True)
    if row is not None and row.status == UPDATING:
        _rollback(row, reason)


def _rollback(row: EndpointRow, reason: str) -> None:
    row.pending_config_name = None
    row.deployment = drop_placing(row.deployment, SHIFT)
    row.spec = retention.settle(row.spec, applied=False)
    _set(row, IN_SERVICE, reason)


def finish_delete(session: Session, ref: str) -> bool:
    """Remove the row unless a host has instances of it to stop (db/endpoint_spread.py)."""
    row = locate(session, EndpointRow, ref, lock=True)
    if row is None or row.status != DELETING or not settled(row.deployment):
        return False
    session.delete(row)
    return True
