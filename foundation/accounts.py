"""The account a request acts for, and the ARNs of its resources."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Account:
    region: str
    account_id: str

    def arn(self, kind: str, name: str) -> str:
        """`arn:aws:sagemaker:<region>:<account>:<kind>/<lower-cased name>`."""
        return f"arn:aws:sagemaker:{self.region}:{self.account_id}:{kind}/{name.lower()}"
