"""The operation registry: `X-Amz-Target: SageMaker.<Op>` -> handler."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints

from eaglenest.db.session import Database
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.queue import TaskQueue
from eaglenest.foundation.settings import Settings
from eaglenest.foundation.shapes import INPUT_SHAPES, AwsShape
from eaglenest.foundation.store.storage import BucketStore


@dataclass
class Context:
    """What a handler may use: settings, the database, the task queue and the artifact
    store (Create requests check and claim the buckets they name in it)."""

    settings: Settings
    db: Database
    queue: TaskQueue
    account: Account
    store: BucketStore | None = None
    #: seconds after which a job owner that stopped heartbeating counts as dead
    lease_seconds: float = 60.0


Handler = Callable[[Context, Any], dict[str, Any] | None]
#: operation -> handler; the handler takes the operation's generated input shape
#: (INPUT_SHAPES[operation]), which the protocol parses the request body into
REGISTRY: dict[str, Handler] = {}
Req = TypeVar("Req", bound=AwsShape)
Fn = Callable[[Context, Req], dict[str, Any] | None]


def operation(name: str) -> Callable[[Fn[Req]], Fn[Req]]:
    """Register ``fn(ctx, req: <Operation>Input)``; its ``req`` annotation must be the
    operation's generated input class, so the parsed shape and the handler agree."""

    def register(fn: Fn[Req]) -> Fn[Req]:
        if name in REGISTRY:
            raise RuntimeError(f"operation {name} registered twice")
        expected = INPUT_SHAPES[name]
        taken = get_type_hints(fn).get("req")
        if taken is not expected:
            raise TypeError(f"{fn.__name__} must take req: {expected.__name__}, not {taken}")
        REGISTRY[name] = fn
        return fn

    return register
