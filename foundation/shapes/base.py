"""Hand-written building blocks for the generated shape modules.

* :class:`AwsShape` - base of every botocore structure (``extra="forbid"``, python ``re``).
* :class:`AwsUnion` - base of structures botocore marks ``union: true`` (exactly one member).
* :data:`AwsTimestamp` - epoch seconds (int/float) or ISO-8601 in, aware UTC ``datetime``
  out, epoch seconds ``float`` in JSON dumps.
* :func:`aws_pattern` - turns a botocore (Java) pattern into an anchored python pattern and
  remembers the original for messages (:data:`ORIGINAL_PATTERNS`).
* :func:`unwrap` / :func:`constraints` - read a field's type back (validation messages, tests).
"""

from __future__ import annotations

import types
from datetime import UTC, datetime
from typing import Annotated, Any, Self, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator, model_validator
from pydantic_core import PydanticCustomError

# anchored python pattern -> the botocore pattern it came from (for AWS-style messages)
ORIGINAL_PATTERNS: dict[str, str] = {}

# Java: "." stops at these, and "$" may match before a final one of them.
_LINE_TERMINATORS = r"\n\r\x85\u2028\u2029"
_JAVA_DOLLAR = r"(?=(?:\r\n|[" + _LINE_TERMINATORS + r"])?\Z)"
# \p{Z}: every Unicode separator (Zs, Zl, Zp), written out for use inside a character class.
_SEPARATORS = r" \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_UNICODE_WORD = ("\\p{L}", "\\p{N}", "_")


def _class_body(body: str) -> tuple[str, bool]:
    """Translate the inside of a character class; returns (body, needs_unicode)."""
    if "\\p{" not in body and "\\P{" not in body:
        return body, False
    if "\\P{" in body or not all(part in body for part in _UNICODE_WORD):
        raise NotImplementedError(f"unsupported unicode class in [{body}]")
    for part in _UNICODE_WORD:
        body = body.replace(part, "", 1)
    body = body.replace("\\p{Z}", _SEPARATORS)
    if "\\p{" in body:
        raise NotImplementedError(f"unsupported unicode class in [{body}]")
    return "\\w" + body, True  # unicode \w == \p{L} | \p{N} | _


def java_to_python(pattern: str) -> str:
    """Anchored python-``re`` equivalent of a botocore (Java ``Pattern.matches``) pattern.

    ASCII mode gives ``\\d \\s \\S \\w`` Java's meanings; ``.`` and ``$`` get Java's line
    terminators; ``[\\p{L}\\p{N}_...]`` becomes unicode ``\\w`` (the only form botocore uses).
    """
    out: list[str] = []
    unicode_mode = False
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            if pattern[i + 1 : i + 2] in ("p", "P"):
                raise NotImplementedError(f"unicode class outside [...] in {pattern!r}")
            out.append(pattern[i : i + 2])
            i += 2
        elif char == "[":
            end = _class_end(pattern, i)
            body, needs_unicode = _class_body(pattern[i + 1 : end])
            unicode_mode = unicode_mode or needs_unicode
            out.append("[" + body + "]")
            i = end + 1
        else:
            out.append({".": f"[^{_LINE_TERMINATORS}]", "$": _JAVA_DOLLAR}.get(char, char))
            i += 1
    translated = "".join(out)
    if unicode_mode and any(esc in translated for esc in ("\\d", "\\s", "\\S", "\\W", "\\D")):
        raise NotImplementedError(f"mixed unicode and ASCII classes in {pattern!r}")
    return ("" if unicode_mode else "(?a)") + r"\A(?:" + translated + r")\Z"


def _class_end(pattern: str, start: int) -> int:
    """Index of the ``]`` closing the class opened at ``start`` (no nested classes)."""
    i = start + 1
    if pattern[i : i + 1] == "^":
        i += 1
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
            continue
        if pattern[i] == "[":
            raise NotImplementedError(f"nested character class in {pattern!r}")
        if pattern[i] == "]":
            return i
        i += 1
    raise ValueError(f"unterminated character class in {pattern!r}")


def aws_pattern(original: str) -> str:
    """The anchored python pattern for ``original``; remembers the mapping for messages."""
    anchored = java_to_python(original)
    ORIGINAL_PATTERNS[anchored] = original
    return anchored


def _type_error(expected: str) -> PydanticCustomError:
    return PydanticCustomError("aws_type", "expected {expected}", {"expected": expected})


def to_utc(value: object) -> datetime:
    """Epoch seconds (int/float), ISO-8601 text or a datetime -> timezone-aware UTC."""
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, tz=UTC)
        except (OverflowError, OSError, ValueError):
            raise _type_error("timestamp") from None
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise _type_error("timestamp") from None
    else:
        raise _type_error("timestamp")
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+01:00: before year 1 in UTC
        raise _type_error("timestamp") from None


def to_epoch(value: datetime) -> float:
    return value.timestamp()


AwsTimestamp = Annotated[
    datetime,
    PlainValidator(to_utc),
    PlainSerializer(to_epoch, return_type=float, when_used="json"),
]


class AwsShape(BaseModel):
    """A botocore structure: fields are the wire's PascalCase member names."""

    model_config = ConfigDict(
        extra="forbid",
        regex_engine="python-re",
        # a member renamed in python (``Schema_``) keeps its exact wire name as the alias
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
    )


class AwsUnion(AwsShape):
    """A botocore ``union: true`` structure: exactly one member must be set."""

    @model_validator(mode="after")
    def _exactly_one_member(self) -> Self:
        fields = type(self).model_fields
        members = [info.alias or name for name, info in fields.items()]
        values = [getattr(self, name) for name in fields]
        chosen = [wire for wire, value in zip(members, values, strict=True) if value is not None]
        if len(chosen) != 1:
            raise PydanticCustomError(
                "aws_union", "exactly one member must be set", {"set": chosen, "members": members}
            )
        return self


def unwrap(annotation: Any, metadata: tuple[Any, ...] = ()) -> tuple[Any, tuple[Any, ...]]:
    """Strip ``X | None`` and ``Annotated`` layers: (bare type, collected metadata)."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation, *extra = get_args(annotation)
            metadata = (*metadata, *extra)
        elif origin in (Union, types.UnionType):
            members = [arg for arg in get_args(annotation) if arg is not type(None)]
            if len(members) != 1:
                return annotation, metadata
            annotation = members[0]
        else:
            return annotation, metadata


_CONSTRAINT_NAMES = ("min_length", "max_length", "ge", "le", "pattern")


def constraints(metadata: tuple[Any, ...]) -> dict[str, Any]:
    """min_length / max_length / ge / le / pattern found in a field's metadata."""
    found: dict[str, Any] = {}
    for item in metadata:
        nested = getattr(item, "metadata", None)
        if isinstance(nested, list):  # a FieldInfo from Field(...) inside Annotated
            found.update(constraints(tuple(nested)))
            continue
        for name in _CONSTRAINT_NAMES:
            value = getattr(item, name, None)
            if value is not None:
                found[name] = value
    return found
