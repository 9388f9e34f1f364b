"""An endpoint whose instances run on several hosts: the deployment record's parts that say
what a transition has started so far and what each host still has to stop.

Contract:
- `PLACING`: the instances a transition (Creating, Updating, SystemUpdating) has started so
  far, variant -> record (workers/serving/records.py), while it is handed from host to host
  to place the rest. Written only by the worker that owns the transition (`save_placing`);
  dropped when the transition ends (`next_deployment`, and endpoints_repo's rollback).
- `RETIRING`: host -> instance records its worker is to stop (a worker only signals the
  processes of its own host). `retire` adds to it, `retired` removes what a host stopped;
  `next_deployment` keeps it when a transition writes a new deployment, and the endpoint's row is
  not removed (endpoints_repo.finish_delete) while it names a host.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy.orm import Session

from eaglenest.db.repository import locate
from eaglenest.db.tables import EndpointRow

PLACING, RETIRING = "Placing", "Retiring"


def next_deployment(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The deployment a transition writes, with what hosts still have to stop kept."""
    out = {k: v for k, v in new.items() if k not in (PLACING, RETIRING)}
    if old.get(RETIRING):
        out[RETIRING] = old[RETIRING]
    return out


def placing(deployment: dict[str, Any]) -> dict[str, Any]:
    """Variant -> record of the instances the transition has started so far."""
    return dict(deployment.get(PLACING) or {})


def save_placing(session: Session, ref: str, owner: str, status: str,
                 servers: dict[str, Any]) -> bool:
    """Record what the transition has started so far (empty: nothing). False when the
    endpoint is gone, in another status or no longer owned by `owner`: the caller stops
    what it started."""
    row = locate(session, EndpointRow, ref, lock=True)
    if row is None or row.status != status or row.owner != owner:
        return False
    rest = {k: v for k, v in row.deployment.items() if k != PLACING}
    row.deployment = {**rest, PLACING: servers} if servers else rest
    return True


def retire(session: Session, ref: str, by_host: dict[str, list[dict[str, Any]]]) -> bool:
    """Hosts' workers are to stop these instances; False when the endpoint is gone."""
    row = locate(session, EndpointRow, ref, lock=True)
    if row is None:
        return False
    now = {h: list(v) for h, v in (row.deployment.get(RETIRING) or {}).items()}
    for host, instances in by_host.items():
        now.setdefault(host, []).extend(instances)
    row.deployment = {**row.deployment, RETIRING: now}
    return True


def retiring(session: Session, ref: str, host: str) -> list[dict[str, Any]]:
    """The instances `host`'s worker is to stop ([] when none, or the endpoint is gone)."""
    row = locate(session, EndpointRow, ref)
    if row is None:
        return []
    return list((row.deployment.get(RETIRING) or {}).get(host) or [])


def retired(session: Session, ref: str, host: str, units: Collection[str]) -> tuple[str, int]:
    """`host` stopped the instances of these units. Returns the endpoint's status ("" when
    gone) and how many instances hosts still have to stop."""
    row = locate(session, EndpointRow, ref, lock=True)
    if row is None:
        return "", 0
    now = dict(row.deployment.get(RETIRING) or {})
    left = [i for i in now.get(host) or [] if i.get("unit") not in units]
    if left:
        now[host] = left
    else:
        now.pop(host, None)
    rest = {k: v for k, v in row.deployment.items() if k != RETIRING}
    row.deployment = {**rest, RETIRING: now} if now else rest
    return row.status, sum(map(len, now.values()))


def forget_hosts(session: Session, ref: str, live: Collection[str]) -> list[dict[str, Any]]:
    """Drop what hosts without a live worker were to stop (their processes died with their
    worker); the instances dropped (their GPUs are for the caller to free)."""
    row = locate(session, EndpointRow, ref, lock=True)
    if row is None:
        return []
    now = dict(row.deployment.get(RETIRING) or {})
    gone = [i for h in list(now) if h not in live for i in now.pop(h)]
    if gone:
        rest = {k: v for k, v in row.deployment.items() if k != RETIRING}
        row.deployment = {**rest, RETIRING: now} if now else rest
    return gone


def settled(deployment: dict[str, Any]) -> bool:
    """Whether no host has instances of the endpoint left to stop."""
    return not deployment.get(RETIRING)


def drop_placing(deployment: dict[str, Any], *also: str) -> dict[str, Any]:
    """The deployment without PLACING (nor the keys `also`), whose instances go to RETIRING
    by their host (a transition ended while handed between hosts: DeleteEndpoint stops
    them)."""
    now = {h: list(v) for h, v in (deployment.get(RETIRING) or {}).items()}
    for record in placing(deployment).values():
        for inst in record.get("instances") or []:
            if inst.get("host"):
                now.setdefault(str(inst["host"]), []).append(inst)
    rest = {k: v for k, v in deployment.items() if k not in (PLACING, RETIRING, *also)}
    return {**rest, RETIRING: now} if now else rest


def save_deployment(session: Session, ref: str, owner: str, status: str,
                    deployment: dict[str, Any]) -> bool:
    """A transition handed to another host records where it stands (a recovery: the
    instances restarted so far); False when the endpoint is gone, in another status or no
    longer owned by `owner`."""
    row = locate(session, EndpointRow, ref, lock=True)
    if row is None or row.status != status or row.owner != owner:
        return False
    row.deployment = next_deployment(row.deployment, deployment)
    return True


def retiring_hosts(session: Session, ref: str) -> list[str]:
    """The hosts whose workers have instances of the endpoint to stop."""
    row = locate(session, EndpointRow, ref)
    return sorted((row.deployment.get(RETIRING) or {}) if row is not None else {})


def handed_off(session: Session, ref: str, status: str) -> None:
    """Every instance of the endpoint (in `status`: Deleting) is stopped or listed for its
    host to stop: the deployment keeps only that list, so that the delete, sent again,
    hands nothing out twice."""
    row = locate(session, EndpointRow, ref, lock=True)
    if row is not None and row.status == status:
        row.deployment = {k: v for k, v in row.deployment.items() if k == RETIRING}
