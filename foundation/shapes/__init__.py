"""Pydantic shapes of the SageMaker operations EagleNest serves, generated from botocore.

    parse_input("CreateModel", body)   -> CreateModelInput  (or ValidationException /
                                          SerializationException with AWS's messages)
    dump_output("CreateModel", data)   -> JSON-ready dict (no None members, epoch floats)

The Resource Groups Tagging API's operations are the same calls with ``service="tagging"``
(its signing name; shapes in the generated ``tagging`` module), CloudWatch's read operations
with ``service="monitoring"`` (shapes in the generated ``cloudwatch`` module).

The shape classes live in the generated modules (``common``, ``models``,
``endpoint_configs``, ``endpoints``, ``optimization_jobs``); regenerate them with
``python -m eaglenest.foundation.shapes._codegen``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from eaglenest.foundation.errors import (
    InternalFailure,
    SerializationException,
    UnknownOperationException,
)

from . import cloudwatch, tagging
from .base import AwsShape, AwsUnion
from .operations import INPUT_SHAPES, OUTPUT_SHAPES
from .validation import json_kind, service_error

__all__ = [
    "INPUT_SHAPES",
    "OUTPUT_SHAPES",
    "AwsShape",
    "AwsUnion",
    "ResponseValidationError",
    "StoredShapeError",
    "dump_output",
    "invalid_output",
    "parse_input",
    "rebuild",
    "to_wire",
]


log = logging.getLogger(__name__)

#: a service's SigV4 signing name -> its operations' input and output shapes
SERVICES: dict[str, tuple[dict[str, type[AwsShape]], dict[str, type[AwsShape] | None]]] = {
    "sagemaker": (INPUT_SHAPES, OUTPUT_SHAPES),
    "tagging": (tagging.INPUT_SHAPES, tagging.OUTPUT_SHAPES),
    "monitoring": (cloudwatch.INPUT_SHAPES, cloudwatch.OUTPUT_SHAPES),
}


class ResponseValidationError(InternalFailure):
    """Our own response broke its shape: a server bug.

    Sent as 400 so that boto3 does not retry a deterministic failure five times.
    """

    status = 400


def _input_shape(operation: str, service: str) -> type[AwsShape]:
    try:
        return SERVICES[service][0][operation]
    except KeyError:
        raise UnknownOperationException(f"Operation {operation} is not supported.") from None


def parse_input(operation: str, body: dict[str, Any], service: str = "sagemaker") -> AwsShape:
    """Validate a request body against ``operation``'s input shape, AWS-style errors."""
    shape = _input_shape(operation, service)
    if not isinstance(body, dict):
        raise SerializationException(
            f"Invalid type for the request body: expected structure, got {json_kind(body)}"
        )
    try:
        return shape.model_validate(body)
    except ValidationError as exc:
        pruned = _without_unknown_members(body, exc)
        if pruned is None:
            raise service_error(shape, exc) from None
    try:
        return shape.model_validate(pruned)
    except ValidationError as exc:
        raise service_error(shape, exc) from None


def _without_unknown_members(body: dict[str, Any], exc: ValidationError) -> dict[str, Any] | None:
    """``body`` without the members the shapes do not know, or None if it has none.

    A newer botocore sends members that our generated shapes (from the locked botocore) do
    not have yet. As AWS's JSON services do, such members are ignored rather than refused,
    so a user's newer boto3 keeps working; they are never stored. Every member the shapes
    know is still validated.
    """
    paths = [e["loc"] for e in exc.errors() if e["type"] == "extra_forbidden"]
    if not paths:
        return None
    pruned = copy.deepcopy(body)
    for path in paths:
        parent: Any = pruned
        for key in path[:-1]:
            try:
                parent = parent[key]
            except (KeyError, IndexError, TypeError):
                return None  # not a plain path into the body: report the original errors
        if not isinstance(parent, dict) or path[-1] not in parent:
            return None
        del parent[path[-1]]
    log.warning("ignored members unknown to the shapes: %s",
                ", ".join(".".join(str(k) for k in path) for path in paths))
    return pruned


S = TypeVar("S", bound=AwsShape)


class StoredShapeError(ValueError):
    """A stored request its shape no longer accepts (the shapes changed since it was stored)."""


def rebuild(shape: type[S], stored: Mapping[str, Any]) -> S:
    """The ``shape`` of a stored request (``to_wire`` of one), for the workers."""
    try:
        return shape.model_validate(stored)
    except ValidationError as exc:
        detail = service_error(shape, exc).message
        raise StoredShapeError(f"the stored {shape.__name__} no longer validates: {detail}") \
            from None


def to_wire(shape: AwsShape) -> dict[str, Any]:
    """The members exactly as set (wire names, no nulls): what the database stores of a
    request; ``<Shape>.model_validate`` of it gives the shape back."""
    data: dict[str, Any] = shape.model_dump(by_alias=True, exclude_none=True, mode="json")
    return data


def invalid_output(operation: str, shape: type[AwsShape], exc: ValidationError
                   ) -> ResponseValidationError:
    """The error of a reply that breaks `operation`'s output `shape` (a server bug)."""
    if exc.title == shape.__name__:
        detail = service_error(shape, exc).message
    else:  # raised while building one of its members
        detail = str(exc).splitlines()[0]
    return ResponseValidationError(f"Invalid {operation} response: {detail}")


def dump_output(operation: str, data: AwsShape | dict[str, Any] | None,
                service: str = "sagemaker") -> dict[str, Any]:
    """The JSON-ready dict of ``operation``'s reply: its output shape (what handlers
    return), or a dict validated against it. None members are dropped and timestamps
    become epoch seconds (float). Operations without an output shape return ``{}``.
    """
    _input_shape(operation, service)
    shape = SERVICES[service][1][operation]
    if shape is None:
        if data:
            members = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ResponseValidationError(f"{operation} has no output members, got {members}")
        return {}
    if isinstance(data, AwsShape):
        if type(data) is not shape:
            raise ResponseValidationError(
                f"Invalid {operation} response: a {type(data).__name__}, not {shape.__name__}")
        model = data
    else:
        try:
            model = shape.model_validate(data or {})
        except ValidationError as exc:
            raise invalid_output(operation, shape, exc) from None
    return model.model_dump(mode="json", exclude_none=True, by_alias=True)
