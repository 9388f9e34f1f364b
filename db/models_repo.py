"""Models: create, get, list, delete. Models have no lifecycle of their own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from eaglenest.db import quotas, tags_repo
from eaglenest.db.repository import checked_claims, get_named, insert_claiming, new_row
from eaglenest.db.tables import ModelRow
from eaglenest.foundation import environment, server_options
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.errors import ValidationException
from eaglenest.foundation.host import ceilings
from eaglenest.foundation.shapes.shared import Tag
from eaglenest.foundation.store.storage import BucketStore


def not_found(account: Account, name: str) -> ValidationException:
    return ValidationException(f'Could not find model "{account.arn("model", name)}".')


def _check_containers(spec: dict[str, Any]) -> None:
    """AWS's rule: a model has one PrimaryContainer or an inference pipeline (Containers),
    exactly one of the two."""
    primary, pipeline = spec.get("PrimaryContainer"), spec.get("Containers")
    if primary is None and not pipeline:
        raise ValidationException(
            "Either PrimaryContainer or Containers must be specified: a model needs at "
            "least one container.")
    if primary is not None and pipeline:
        raise ValidationException(
            "PrimaryContainer and Containers cannot both be specified: use PrimaryContainer "
            "for one container or Containers for an inference pipeline.")


def _check_environment(spec: dict[str, Any]) -> None:
    """Only allowed variables reach a model server (foundation/environment.py), its thread
    counts and lengths are within their ceilings, all the Environment maps together within
    SageMaker's size (foundation/host/ceilings.py), and each container's options are what the
    worker's deploy reads (foundation/server_options.py check_container)."""
    containers = [("PrimaryContainer", spec.get("PrimaryContainer"))]
    containers += [(f"Containers.{i}", c)
                   for i, c in enumerate(spec.get("Containers") or [], start=1)]
    envs = {f"{where}.Environment": (c or {}).get("Environment") for where, c in containers}
    try:
        ceilings.check_environment_size(envs)
        for where, env in envs.items():
            environment.check(env, where)
            ceilings.check_model_environment(env, where, ceilings.host_cpus())
            try:
                server_options.check_container(env or {})
            except server_options.OptionError as exc:
                raise ValidationException(f"{where}: {exc}") from None
    except (environment.EnvironmentRejected, ceilings.LimitError) as exc:
        raise ValidationException(str(exc)) from None


def create(session: Session, account: Account, spec: dict[str, Any],
           store: BucketStore | None = None, limits: quotas.Limits | None = None,
           tags: Sequence[Tag] = ()) -> ModelRow:
    """With `store` (the API: always), every bucket the request names must be the
    account's, or nobody's and the caller the default account; none is claimed (a model's
    buckets are read, not written: db/bucket_claims.py). With `limits` (the API), the account's
    models quota (db/quotas.py)."""
    _check_containers(spec)
    _check_environment(spec)
    if limits is not None:
        quotas.check_new_model(session, account, limits)
    stored_tags = tags_repo.check_new_tags(tags)
    refs = checked_claims(store, account, spec)
    row = new_row(ModelRow, account, "model", spec["ModelName"], spec, stored_tags)
    duplicate = ValidationException(f'Cannot create already existing model "{row.arn}".')
    return insert_claiming(session, row, duplicate, account, store, refs)


def get(session: Session, account: Account, name: str) -> ModelRow:
    return get_named(session, ModelRow, account, name, not_found)


def delete(session: Session, account: Account, name: str) -> None:
    session.delete(get(session, account, name))
