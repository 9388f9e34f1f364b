"""The operation registry: `X-Amz-Target: SageMaker.<Op>` -> handler."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eaglenest.db.session import Database
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.queue import TaskQueue
from eaglenest.foundation.settings import Settings


@dataclass
class Context:
    """What a handler may use: settings, the database and the task queue."""

    settings: Settings
    db: Database
    queue: TaskQueue
    account: Account
    #: seconds after which a job owner that stopped heartbeating counts as dead
    lease_seconds: float = 60.0


Handler = Callable[[Context, Any], dict[str, Any] | None]
REGISTRY: dict[str, Handler] = {}


def operation(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        if name in REGISTRY:
            raise RuntimeError(f"operation {name} registered twice")
        REGISTRY[name] = fn
        return fn

    return register
