"""Turn pydantic validation errors into AWS's ValidationException / SerializationException.

AWS (Coral) reports constraint failures as one message::

    2 validation errors detected: Value 'x!' at 'modelName' failed to satisfy constraint:
    Member must satisfy regular expression pattern: [a-zA-Z0-9]([\\-a-zA-Z0-9]*[a-zA-Z0-9])?; ...

Paths are camelCase member names joined by ".", list elements as ``name.<1-based>.member``
and map entries as ``name.<key>``. A JSON value of the wrong type is a deserialization
failure (SerializationException) and is reported alone, before any constraint.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from eaglenest.foundation.errors import (
    SerializationException,
    ServiceError,
    ValidationException,
    constraint_message,
)

from .base import ORIGINAL_PATTERNS, constraints, unwrap

MAX_VALUE_CHARS = 256  # longer values are cut in messages
NOT_NULL = "Member must not be null"

# pydantic error types that mean "this JSON value has the wrong type"
TYPE_ERRORS = frozenset(
    {
        "aws_type",
        "bool_parsing",
        "bool_type",
        "dict_type",
        "float_parsing",
        "float_type",
        "int_from_float",
        "int_parsing",
        "int_type",
        "list_type",
        "model_attributes_type",
        "model_type",
        "string_type",
        "string_unicode",
    }
)


@dataclass(frozen=True)
class Location:
    """Where an error sits: the AWS path, the (unwrapped) type expected there and its limits."""

    path: str
    expected: Any  # None for an unknown member
    limits: dict[str, Any] = field(default_factory=dict)  # min_length/max_length/ge/le/pattern
    map_key: bool = False


def camel(name: str) -> str:
    return name[:1].lower() + name[1:]


def _field(model: type[BaseModel], wire_name: str) -> tuple[str, Any, tuple[Any, ...]] | None:
    """(wire name, annotation, the field's own metadata) of a member, if known."""
    for name, info in model.model_fields.items():
        if wire_name in (name, info.alias):
            return info.alias or name, info.annotation, tuple(info.metadata)
    return None


def _at(path: list[str], annotation: Any, metadata: tuple[Any, ...], map_key: bool) -> Location:
    if annotation is None:
        return Location(".".join(path), None)
    base, metadata = unwrap(annotation, metadata)
    return Location(".".join(path), base, constraints(metadata), map_key)


def locate(model: type[BaseModel], loc: tuple[str | int, ...]) -> Location:
    """Follow a pydantic error location through the shape classes."""
    expected: Any = model
    metadata: tuple[Any, ...] = ()
    parts: list[str] = []
    for index, segment in enumerate(loc):
        base = unwrap(expected)[0]
        origin = get_origin(base)
        metadata = ()
        if isinstance(base, type) and issubclass(base, BaseModel):
            found = _field(base, str(segment))
            parts.append(camel(found[0]) if found else str(segment))
            expected, metadata = (found[1], found[2]) if found else (None, ())
        elif origin is list and isinstance(segment, int):
            parts += [str(segment + 1), "member"]
            expected = get_args(base)[0]
        elif origin is dict:
            key_type, value_type = get_args(base)
            if index == len(loc) - 2 and loc[-1] == "[key]":
                return _at(parts, key_type, (), map_key=True)
            parts.append(str(segment))
            expected = value_type
        else:
            parts.append(str(segment))
            expected = None
    return _at(parts, expected, metadata, map_key=False)


def type_name(expected: Any) -> str:
    """The AWS type name of a shape class / annotation."""
    if expected is bool:
        return "boolean"
    names = {int: "integer", float: "float", str: "string", datetime: "timestamp"}
    if expected in names:
        return names[expected]
    origin = get_origin(expected)
    if origin is Literal:
        return "string"
    if origin in (list, dict):
        return "list" if origin is list else "map"
    return "structure"


def json_kind(value: object) -> str:
    """The JSON type of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list | tuple) else "object"


def render_value(value: object) -> str:
    """A value as AWS quotes it: strings as-is, everything else as compact JSON, cut short."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    if len(text) > MAX_VALUE_CHARS:
        text = text[: MAX_VALUE_CHARS - 3] + "..."
    return text


def _number(value: object) -> str:
    return json.dumps(value)


def _union_text(ctx: dict[str, Any]) -> str:
    chosen = [camel(name) for name in ctx.get("set", [])]
    members = [camel(name) for name in ctx.get("members", [])]
    if not chosen:
        return f"Member must have exactly one member set: none of [{', '.join(members)}] is set"
    return (
        f"Member must have exactly one member set, but {len(chosen)} are set: [{', '.join(chosen)}]"
    )


def _pattern_text(anchored: str) -> str:
    pattern = ORIGINAL_PATTERNS.get(anchored, anchored)
    return f"Member must satisfy regular expression pattern: {pattern}"


def string_texts(value: str, limits: dict[str, Any]) -> list[str]:
    """Every constraint a string breaks, as AWS lists them: pattern first, then length.

    pydantic stops at the first failed check; AWS reports each one.
    """
    texts: list[str] = []
    pattern = limits.get("pattern")
    if pattern is not None and re.match(pattern, value) is None:
        texts.append(_pattern_text(pattern))
    if "min_length" in limits and len(value) < limits["min_length"]:
        texts.append(f"Member must have length greater than or equal to {limits['min_length']}")
    if "max_length" in limits and len(value) > limits["max_length"]:
        texts.append(f"Member must have length less than or equal to {limits['max_length']}")
    return texts


def constraint_texts(error: ErrorDetails, where: Location) -> list[str]:
    """AWS's wording of the constraints that ``error`` broke (usually one)."""
    kind = error["type"]
    ctx: dict[str, Any] = dict(error.get("ctx") or {})
    if kind.startswith("string_") and isinstance(error["input"], str):
        texts = string_texts(error["input"], {**where.limits, **ctx})
        if texts:
            return texts
    if kind in ("string_too_long", "too_long"):
        return [f"Member must have length less than or equal to {ctx['max_length']}"]
    if kind in ("string_too_short", "too_short"):
        return [f"Member must have length greater than or equal to {ctx['min_length']}"]
    if kind == "less_than_equal":
        return [f"Member must have value less than or equal to {_number(ctx['le'])}"]
    if kind == "greater_than_equal":
        return [f"Member must have value greater than or equal to {_number(ctx['ge'])}"]
    if kind == "string_pattern_mismatch":
        return [_pattern_text(ctx["pattern"])]
    if kind == "literal_error" and get_origin(where.expected) is Literal:
        values = ", ".join(str(v) for v in get_args(where.expected))
        return [f"Member must satisfy enum value set: [{values}]"]
    if kind == "extra_forbidden":
        return ["Member is not a known member"]
    if kind == "aws_union":
        return [_union_text(ctx)]
    return ["Member is not valid"]


def is_type_error(error: ErrorDetails) -> bool:
    if error["input"] is None or error["type"] == "missing":
        return False
    if error["type"] == "literal_error":
        return not isinstance(error["input"], str)
    return error["type"] in TYPE_ERRORS


def violations(error: ErrorDetails, where: Location) -> list[str]:
    """The ``Value ... at ... failed to satisfy constraint: ...`` clauses for one error."""
    if error["type"] == "missing" or (error["input"] is None and error["type"] in TYPE_ERRORS):
        return [f"Value null at '{where.path}' failed to satisfy constraint: {NOT_NULL}"]
    value = render_value(error["input"])
    prefix = f"Value '{value}' at '{where.path}' failed to satisfy constraint"
    texts = constraint_texts(error, where)
    if where.map_key:
        texts = [f"Map keys must satisfy constraint: [{text}]" for text in texts]
    return [f"{prefix}: {text}" for text in texts]


def service_error(model: type[BaseModel], exc: ValidationError) -> ServiceError:
    """The AWS error for a failed ``model.model_validate``: wrong types win over constraints."""
    errors = exc.errors(include_url=False)
    located = [(error, locate(model, error["loc"])) for error in errors]
    for error, where in located:
        if is_type_error(error):
            expected = "string" if where.expected is None else type_name(where.expected)
            got = json_kind(error["input"])
            return SerializationException(
                f"Invalid type at '{where.path}': expected {expected}, got {got}"
            )
    clauses = [clause for error, where in located for clause in violations(error, where)]
    return ValidationException(constraint_message(list(dict.fromkeys(clauses))))
