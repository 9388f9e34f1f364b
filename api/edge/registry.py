"""The operation registry of the AWS JSON 1.1 services: `X-Amz-Target: <prefix><Op>` ->
handler, one `JsonService` per service (its folder under api/ declares it; api/edge/
json_protocol.py lists the services it dispatches)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints

from pydantic import ValidationError

from eaglenest.db.session import Database
from eaglenest.foundation import shapes
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.errors import ServiceError, ValidationException
from eaglenest.foundation.queue import TaskQueue
from eaglenest.foundation.settings import Settings
from eaglenest.foundation.shapes import AwsShape
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


Handler = Callable[[Context, Any], AwsShape | None]
Req = TypeVar("Req", bound=AwsShape)
Out = TypeVar("Out", bound=AwsShape | None)
Fn = Callable[[Context, Req], Out]


@dataclass
class JsonService:
    """One AWS JSON 1.1 service: its SigV4 signing name (also the name of its shape tables
    in foundation.shapes.SERVICES), its X-Amz-Target prefix, and its handlers by operation.

    Every operation of the service's shape tables must get exactly one handler, registered
    with `operation`; the handler takes the operation's generated input class and returns
    its generated output class (None where botocore has no output)."""

    signing_name: str
    target_prefix: str
    #: how the operation is labelled in the metrics: "<label_prefix><Op>"
    label_prefix: str = ""
    #: the service's word for a request that breaks its shape (parse_input raises SageMaker's
    #: ValidationException; a service with its own code re-raises it as this, same message)
    invalid_request: type[ServiceError] | None = None
    handlers: dict[str, Handler] = field(default_factory=dict)

    @property
    def inputs(self) -> dict[str, type[AwsShape]]:
        return shapes.SERVICES[self.signing_name][0]

    @property
    def outputs(self) -> dict[str, type[AwsShape] | None]:
        return shapes.SERVICES[self.signing_name][1]

    def operation(self, name: str) -> Callable[[Fn[Req, Out]], Fn[Req, Out]]:
        """Register ``fn(ctx, req: <Op>Input) -> <Op>Output``; the annotations must be the
        operation's generated classes, so the parsed shape, the handler and the reply agree."""

        def register(fn: Fn[Req, Out]) -> Fn[Req, Out]:
            if name in self.handlers:
                raise RuntimeError(f"operation {name} registered twice")
            hints = get_type_hints(fn)
            expected_in, expected_out = self.inputs[name], self.outputs[name]
            if hints.get("req") is not expected_in:
                raise TypeError(f"{fn.__name__} must take req: {expected_in.__name__}, "
                                f"not {hints.get('req')}")
            returns = hints.get("return")
            if returns is not (expected_out or type(None)):
                wanted = expected_out.__name__ if expected_out else "None"
                raise TypeError(f"{fn.__name__} must return {wanted}, not {returns}")
            self.handlers[name] = fn
            return fn

        return register

    def operation_of(self, target: str) -> str | None:
        """The operation an X-Amz-Target names, if it is one of ours."""
        op = target.removeprefix(self.target_prefix)
        return op if target.startswith(self.target_prefix) and op in self.handlers else None

    def call(self, ctx: Context, op: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Parse `payload` into `op`'s input shape, run its handler, the reply's JSON."""
        try:
            req = shapes.parse_input(op, payload, service=self.signing_name)
        except ValidationException as exc:
            if self.invalid_request is None:
                raise
            raise self.invalid_request(exc.message) from None
        try:
            result = self.handlers[op](ctx, req)
        except ValidationError as exc:  # the handler built a reply its shape refuses
            raise shapes.invalid_output(op, self.outputs[op] or AwsShape, exc) from None
        return shapes.dump_output(op, result, service=self.signing_name)
