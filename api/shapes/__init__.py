"""Pydantic shapes of the SageMaker operations EagleNest serves, generated from botocore.

    parse_input("CreateModel", body)   -> CreateModelInput  (or ValidationException /
                                          SerializationException with AWS's messages)
    dump_output("CreateModel", data)   -> JSON-ready dict (no None members, epoch floats)

The shape classes live in the generated modules (``common``, ``models``,
``endpoint_configs``, ``endpoints``, ``optimization_jobs``); regenerate them with
``python -m api.shapes._codegen``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from api.errors import InternalFailure, SerializationException, UnknownOperationException

from .base import AwsShape, AwsUnion
from .registry import INPUT_SHAPES, OUTPUT_SHAPES
from .validation import json_kind, service_error

__all__ = [
    "INPUT_SHAPES",
    "OUTPUT_SHAPES",
    "AwsShape",
    "AwsUnion",
    "ResponseValidationError",
    "dump_output",
    "parse_input",
]


class ResponseValidationError(InternalFailure):
    """Our own response broke its shape: a server bug.

    Sent as 400 so that boto3 does not retry a deterministic failure five times.
    """

    status = 400


def _input_shape(operation: str) -> type[AwsShape]:
    try:
        return INPUT_SHAPES[operation]
    except KeyError:
        raise UnknownOperationException(f"Operation {operation} is not supported.") from None


def parse_input(operation: str, body: dict[str, Any]) -> AwsShape:
    """Validate a request body against ``operation``'s input shape, AWS-style errors."""
    shape = _input_shape(operation)
    if not isinstance(body, dict):
        raise SerializationException(
            f"Invalid type for the request body: expected structure, got {json_kind(body)}"
        )
    try:
        return shape.model_validate(body)
    except ValidationError as exc:
        raise service_error(shape, exc) from None


def dump_output(operation: str, data: dict[str, Any]) -> dict[str, Any]:
    """Validate ``data`` against ``operation``'s output shape; return the JSON-ready dict.

    None members are dropped and timestamps become epoch seconds (float). Operations
    without an output shape return ``{}``.
    """
    _input_shape(operation)
    shape = OUTPUT_SHAPES[operation]
    if shape is None:
        if data:
            raise ResponseValidationError(f"{operation} has no output members, got {sorted(data)}")
        return {}
    try:
        model = shape.model_validate(data)
    except ValidationError as exc:
        detail = service_error(shape, exc).message
        raise ResponseValidationError(f"Invalid {operation} response: {detail}") from None
    return model.model_dump(mode="json", exclude_none=True, by_alias=True)
