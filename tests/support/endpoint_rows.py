"""Rows for repository-level endpoint tests: model `m`, configs `c1` and `c2` (one variant
`v` each), endpoint `ep` on `c1` (Creating), all in ACCOUNT; EP is the endpoint's ARN (what
workers pass to the repository)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from eaglenest.db import endpoint_configs_repo, endpoints_repo, models_repo
from eaglenest.foundation.accounts import Account

ACCOUNT = Account("us-east-1", "123456789012")
EP = ACCOUNT.arn("endpoint", "ep")
ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"


#: a second account with rows of the same names (`seed_endpoint(s, OTHER)`)
OTHER = Account("us-east-1", "222222222222")
OTHER_EP = OTHER.arn("endpoint", "ep")


def seed_endpoint(s: Session, account: Account = ACCOUNT, model_uri: str | None = None) -> None:
    container = {"Image": "x", **({"ModelDataUrl": model_uri} if model_uri else {})}
    models_repo.create(s, account, {"ModelName": "m", "ExecutionRoleArn": ROLE,
                                    "PrimaryContainer": container})
    for cfg in ("c1", "c2"):
        endpoint_configs_repo.create(s, account, {
            "EndpointConfigName": cfg, "ProductionVariants": [{
                "VariantName": "v", "ModelName": "m", "InstanceType": "ml.m5.large"}]})
    endpoints_repo.create(s, account, {"EndpointName": "ep", "EndpointConfigName": "c1"})
