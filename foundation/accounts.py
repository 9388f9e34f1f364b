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


@dataclass(frozen=True)
class ResourceRef:
    """A resource's ARN taken apart: what a queued task names (the account with the name)."""

    arn: str
    account_id: str
    name: str

    @classmethod
    def parse(cls, arn: str) -> ResourceRef | None:
        """None unless `arn` is `arn:aws:sagemaker:<region>:<12 digits>:<kind>/<name>`."""
        parts = arn.split(":", 5)
        if len(parts) != 6 or parts[:3] != ["arn", "aws", "sagemaker"]:
            return None
        account, (_, slash, name) = parts[4], parts[5].partition("/")
        if not (len(account) == 12 and account.isdigit() and slash and name):
            return None
        return cls(arn, account, name)

    @property
    def local_key(self) -> str:
        """`<account>/<name>`: what names the resource's files and processes on a host, so
        two accounts' resources of one name never share them."""
        return f"{self.account_id}/{self.name}"
