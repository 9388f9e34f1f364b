"""Endpoints and their lifecycle: the one place where an endpoint changes status.

    Creating --mark_in_service--> InService --request_update--> Updating
    Creating --mark_failed------> Failed      Updating --finish_update--> InService
    any ------request_delete----> Deleting (or gone at once if nothing is deployed)
    Deleting --finish_delete----> (row removed)
    Updating --rollback_update--> InService (old config kept, FailureReason set)
    InService --begin_recovery--> SystemUpdating --finish_recovery--> InService / Failed

The web layer calls the request_* functions; serving workers call the others.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from api.errors import ValidationException
from db import endpoint_configs_repo, tags_repo
from db.common import Account, find, insert_unique, now
from db.tables import EndpointRow

CREATING, IN_SERVICE, UPDATING = "Creating", "InService", "Updating"
DELETING, FAILED = "Deleting", "Failed"
SYSTEM_UPDATING = "SystemUpdating"


def not_found(account: Account, name: str) -> ValidationException:
    return ValidationException(f'Could not find endpoint "{account.arn("endpoint", name)}".')


def create(session: Session, account: Account, spec: dict[str, Any]) -> EndpointRow:
    config = endpoint_configs_repo.get(session, account, spec["EndpointConfigName"])
    name = spec["EndpointName"]
    tags = tags_repo.check_new_tags(spec.pop("Tags", None) or [])
    t = now()
    row = EndpointRow(
        name=name, name_key=name.lower(), arn=account.arn("endpoint", name),
        creation_time=t, last_modified_time=t, spec=spec, tags=tags,
        status=CREATING, config_name=config.name, deployment={},
    )
    duplicate = ValidationException(f'Cannot create already existing endpoint "{row.arn}".')
    insert_unique(session, row, duplicate)
    return row


def get(session: Session, account: Account, name: str, *, lock: bool = False) -> EndpointRow:
    row = find(session, EndpointRow, name, lock=lock)
    if row is None:
        raise not_found(account, name)
    return row


def _set(row: EndpointRow, status: str, reason: str | None = None) -> None:
    row.status = status
    row.failure_reason = reason
    row.last_modified_time = now()


def request_update(
    session: Session, account: Account, name: str, config_name: str, spec: dict[str, Any]
) -> EndpointRow:
    row = get(session, account, name, lock=True)
    config = endpoint_configs_repo.get(session, account, config_name)
    if row.status != IN_SERVICE:
        raise ValidationException(
            f'Cannot update endpoint "{row.arn}" while it is {row.status}: '
            f"an endpoint can be updated only when its status is {IN_SERVICE}."
        )
    row.pending_config_name = config.name
    row.spec = {**row.spec, "PendingUpdate": spec}
    _set(row, UPDATING)
    return row


def request_delete(session: Session, account: Account, name: str) -> bool:
    """Return True if a worker must stop serving processes (status Deleting)."""
    row = get(session, account, name, lock=True)
    if not row.deployment:  # nothing was ever started: nothing to tear down
        session.delete(row)
        return False
    _set(row, DELETING)
    return True


def mark_in_service(session: Session, name: str, deployment: dict[str, Any]) -> bool:
    """False if the endpoint was deleted (or changed) meanwhile: the caller must tear down."""
    row = find(session, EndpointRow, name, lock=True)
    if row is None or row.status != CREATING:
        return False
    row.deployment = deployment
    _set(row, IN_SERVICE)
    return True


def mark_failed(session: Session, name: str, reason: str) -> None:
    row = find(session, EndpointRow, name, lock=True)
    if row is not None and row.status in (CREATING, IN_SERVICE, SYSTEM_UPDATING):
        _set(row, FAILED, reason)


def begin_recovery(session: Session, name: str) -> bool:
    """A worker found an InService endpoint's processes dead and will restart them."""
    row = find(session, EndpointRow, name, lock=True)
    if row is None or row.status != IN_SERVICE:
        return False
    _set(row, SYSTEM_UPDATING)
    return True


def finish_recovery(session: Session, name: str, deployment: dict[str, Any]) -> bool:
    row = find(session, EndpointRow, name, lock=True)
    if row is None or row.status != SYSTEM_UPDATING:
        return False
    row.deployment = deployment
    _set(row, IN_SERVICE)
    return True


def finish_update(session: Session, name: str, deployment: dict[str, Any]) -> bool:
    row = find(session, EndpointRow, name, lock=True)
    if row is None or row.status != UPDATING or not row.pending_config_name:
        return False
    row.config_name = row.pending_config_name
    row.pending_config_name = None
    row.deployment = deployment
    row.spec = {k: v for k, v in row.spec.items() if k != "PendingUpdate"}
    _set(row, IN_SERVICE)
    return True


def rollback_update(session: Session, name: str, reason: str) -> None:
    row = find(session, EndpointRow, name, lock=True)
    if row is not None and row.status == UPDATING:
        row.pending_config_name = None
        row.spec = {k: v for k, v in row.spec.items() if k != "PendingUpdate"}
        _set(row, IN_SERVICE, reason)


def finish_delete(session: Session, name: str) -> None:
    row = find(session, EndpointRow, name, lock=True)
    if row is not None and row.status == DELETING:
        session.delete(row)
