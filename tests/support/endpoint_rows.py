"""Rows for repository-level endpoint tests: model `m`, configs `c1` and `c2` (one variant
`v` each), endpoint `ep` on `c1` (Creating), all in ACCOUNT."""

from __future__ import annotations

from sqlalchemy.orm import Session

from eaglenest.db import endpoint_configs_repo, endpoints_repo, models_repo
from eaglenest.foundation.accounts import Account

ACCOUNT = Account("us-east-1", "123456789012")


def seed_endpoint(s: Session) -> None:
    models_repo.create(s, ACCOUNT, {"ModelName": "m", "ExecutionRoleArn": "r",
                                    "PrimaryContainer": {"Image": "x"}})
    for cfg in ("c1", "c2"):
        endpoint_configs_repo.create(s, ACCOUNT, {
            "EndpointConfigName": cfg, "ProductionVariants": [{
                "VariantName": "v", "ModelName": "m", "InstanceType": "ml.m5.large"}]})
    endpoints_repo.create(s, ACCOUNT, {"EndpointName": "ep", "EndpointConfigName": "c1"})
