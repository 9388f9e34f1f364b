"""Endpoint configs: create (checks each variant's model), get, delete."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from eaglenest.db import models_repo, quotas, tags_repo
from eaglenest.db.repository import checked_claims, find, get_named, insert_claiming, new_row
from eaglenest.db.tables import EndpointConfigRow, ModelRow
from eaglenest.foundation import instance_types
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.errors import (
    ResourceLimitExceeded,
    ValidationException,
    constraint_message,
)
from eaglenest.foundation.shapes.shared import Tag
from eaglenest.foundation.store.storage import BucketStore


def not_found(account: Account, name: str) -> ValidationException:
    arn = account.arn("endpoint-config", name)
    return ValidationException(f'Could not find endpoint configuration "{arn}".')


def _check_instance_counts(spec: dict[str, Any], max_instances: int) -> None:
    """Each instance is a whole model server on the serving host: cap them per variant.

    A quota, not a shape constraint (botocore allows any count >= 1), so it is refused the
    way SageMaker refuses instances beyond an account quota: ResourceLimitExceeded."""
    for key in ("ProductionVariants", "ShadowProductionVariants"):
        for i, v in enumerate(spec.get(key) or [], start=1):
            count = v.get("InitialInstanceCount") or 1
            if count > max_instances:
                raise ResourceLimitExceeded(
                    f"{key}.{i}.InitialInstanceCount is {count}, but this service runs at "
                    f"most {max_instances} instances (model server processes) per variant "
                    f"(EAGLENEST_MAX_INSTANCES_PER_VARIANT).")


#: ServerlessConfig.MemorySizeInMB: 1 GB steps from 1024 to 6144 (the shape only has the range)
SERVERLESS_MEMORY_SIZES = (1024, 2048, 3072, 4096, 5120, 6144)


def _check_serverless(spec: dict[str, Any]) -> None:
    """What AWS documents for a serverless variant beyond the shape's ranges, reported in
    AWS's aggregate form: MemorySizeInMB one of the 1 GB steps, ProvisionedConcurrency at
    most MaxConcurrency."""
    errors = []
    for key in ("ProductionVariants", "ShadowProductionVariants"):
        for i, v in enumerate(spec.get(key) or [], start=1):
            cfg = v.get("ServerlessConfig")
            if not cfg:
                continue
            at = f"{key[0].lower()}{key[1:]}.{i}.member.serverlessConfig"
            if cfg["MemorySizeInMB"] not in SERVERLESS_MEMORY_SIZES:
                sizes = ", ".join(map(str, SERVERLESS_MEMORY_SIZES))
                errors.append(f"Value '{cfg['MemorySizeInMB']}' at '{at}.memorySizeInMB' "
                              f"failed to satisfy constraint: Member must satisfy enum value "
                              f"set: [{sizes}]")
            provisioned = cfg.get("ProvisionedConcurrency")
            if provisioned is not None and provisioned > cfg["MaxConcurrency"]:
                errors.append(f"Value '{provisioned}' at '{at}.provisionedConcurrency' failed "
                              f"to satisfy constraint: Member must have value less than or "
                              f"equal to MaxConcurrency ({cfg['MaxConcurrency']})")
    if errors:
        raise ValidationException(constraint_message(errors))


def _check_variants(session: Session, account: Account, spec: dict[str, Any]) -> None:
    seen: set[str] = set()
    variants = spec["ProductionVariants"] + (spec.get("ShadowProductionVariants") or [])
    for v in variants:
        name = v["VariantName"]
        if name.lower() in seen:
            raise ValidationException(
                f"Variant names must be unique within an endpoint configuration: "
                f"'{name}' appears more than once."
            )
        seen.add(name.lower())
        if not v.get("InstanceType") and not v.get("ServerlessConfig"):
            raise ValidationException(
                f"Variant '{name}' must set either InstanceType or ServerlessConfig."
            )
        model = v.get("ModelName")
        if model is None:
            raise ValidationException(f"Variant '{name}' must set ModelName.")
        if find(session, ModelRow, model, account_id=account.account_id) is None:
            raise models_repo.not_found(account, model)


#: the serving backend that runs a model on one GPU (workers/serving/deploy.py)
EMBEDDED = "embedded"


def _serving_backend(session: Session, account: Account, model: str) -> str | None:
    """EAGLENEST_SERVING_BACKEND of `model`'s container (PrimaryContainer, else
    Containers[0]), None when unset or when the model does not exist."""
    row = find(session, ModelRow, model, account_id=account.account_id)
    if row is None:
        return None
    container = row.spec.get("PrimaryContainer") or (row.spec.get("Containers") or [{}])[0]
    return ((container or {}).get("Environment") or {}).get("EAGLENEST_SERVING_BACKEND")


def _check_instance_types(session: Session, account: Account, spec: dict[str, Any]) -> None:
    """Each variant's InstanceType is one EagleNest serves (foundation/instance_types.py),
    and a model on the embedded backend, which runs on one GPU, is refused a type with
    several."""
    for key in ("ProductionVariants", "ShadowProductionVariants"):
        for i, v in enumerate(spec.get(key) or [], start=1):
            name, requested = v["VariantName"], v.get("InstanceType")
            if not requested:
                continue  # a serverless variant
            at = f"Variant '{name}': {key}.{i}.InstanceType"
            try:
                kind = instance_types.lookup(requested)
            except instance_types.UnsupportedInstanceType as exc:
                raise ValidationException(f"{at} {exc}") from None
            model = v["ModelName"]
            if (kind.accelerators > 1
                    and _serving_backend(session, account, model) == EMBEDDED):
                raise ValidationException(
                    f"{at} {requested} has {kind.accelerators} GPUs ({kind.accelerators} x "
                    f"{kind.accelerator}), but model '{model}' sets EAGLENEST_SERVING_BACKEND="
                    f"{EMBEDDED}, which runs on one GPU: use EAGLENEST_SERVING_BACKEND=vllm "
                    f"for several GPUs, or an instance type with one.")


def create(session: Session, account: Account, spec: dict[str, Any],
           max_instances: int | None = None,
           store: BucketStore | None = None,
           limits: quotas.Limits | None = None,
           tags: Sequence[Tag] = ()) -> EndpointConfigRow:
    """With `store` (the API: always), every bucket the request names (DataCapture,
    AsyncInference outputs) must be the account's, or nobody's and the caller the default
    account (any caller for Data Capture's destination, which then becomes the account's:
    db/bucket_claims.py). With `limits` (the API), the account's endpoint configurations quota
    (db/quotas.py)."""
    if max_instances is not None:
        _check_instance_counts(spec, max_instances)
    if limits is not None:
        quotas.check_new_endpoint_config(session, account, limits)
    _check_serverless(spec)
    _check_variants(session, account, spec)
    _check_instance_types(session, account, spec)
    stored_tags = tags_repo.check_new_tags(tags)
    refs = checked_claims(store, account, spec)
    row = new_row(EndpointConfigRow, account, "endpoint-config", spec["EndpointConfigName"],
                  spec, stored_tags)
    duplicate = ValidationException(
        f'Cannot create already existing endpoint configuration "{row.arn}".')
    return insert_claiming(session, row, duplicate, account, store, refs)


def get(session: Session, account: Account, name: str) -> EndpointConfigRow:
    return get_named(session, EndpointConfigRow, account, name, not_found)


def delete(session: Session, account: Account, name: str) -> None:
    session.delete(get(session, account, name))
