"""Fuzz every control-plane operation with inputs built from botocore's SageMaker model.

For each operation in ``foundation.shapes.INPUT_SHAPES`` two hypothesis strategies are derived
from botocore's own shapes (``get_service_model("sagemaker")``), not from our pydantic
classes:

* valid inputs: required members always, optional ones sometimes, enums, min/max, list and
  map sizes, unions with exactly one member, and patterns (``from_regex(fullmatch=True)``);
  names are made unique and references point at resources that exist, so creates succeed;
* invalid inputs: one defect somewhere in an otherwise valid input - a wrong JSON type, a
  non-finite number, a value out of range, a bad enum, a pattern violation, a missing or
  null required member, a union with zero or two members, a body that is not a JSON object.

A member the shapes do not know (a newer botocore's) is no defect: valid inputs sometimes
carry one, top-level or nested, and must still succeed (it is ignored, never stored).

Every request is sent raw (``signed_post``), so wrong types reach the server. For every
response: never 5xx or 429; a strict-JSON body; on errors ``__type`` and a ``message``
that names something and leaks no traceback or pydantic internals; and when a call is
rejected the database is unchanged (SQLite's ``PRAGMA data_version`` moves on any commit by
another connection, plus row counts / max ids / statuses for a readable diff). Valid inputs
must never fail shape validation, invalid ones must always be rejected with 400, and a
resource that was created must be describable.

Deterministic (``derandomize=True``) and bounded: 30-45 s (stack start included) on two
shared cores.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import math
import re
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import botocore.session
import httpx
import pytest
from botocore.model import ServiceModel, Shape
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from eaglenest.db.pagination import fingerprint
from eaglenest.foundation import page_tokens
from eaglenest.foundation.shapes import INPUT_SHAPES
from eaglenest.foundation.shapes.base import java_to_python
from tests.support.stack import Stack

SAGEMAKER: ServiceModel = botocore.session.get_session().get_service_model("sagemaker")
OPERATIONS = list(INPUT_SHAPES)
TABLES = ("models", "endpoint_configs", "endpoints", "optimization_jobs")
ROLE = "arn:aws:iam::123456789012:role/EagleNestFuzz"

MAX_VALID = 30  # examples per operation (valid inputs)
MAX_INVALID = 40  # examples per operation (invalid inputs)
MAX_NON_FINITE = 8  # examples per operation (a NaN / Infinity somewhere in a valid input)


def fuzz_settings(max_examples: int) -> settings:
    """Deterministic (CI), no deadline (a request is I/O), no example database on disk."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


# ---------------------------------------------------------------------------------------
# Resources the fuzzed inputs refer to (created once by the `world` fixture)

KNOWN = {
    "model": ["fz-model-0", "fz-model-1"],
    "config": ["fz-config-0", "fz-config-1"],
    "endpoint": ["fz-endpoint-0"],
    "job": ["fz-job-0"],
}
# Delete*/Stop* inputs pick from these, so the resources above stay referable.
VICTIMS = {kind: [f"fz-victim-{kind}-{i}" for i in range(6)] for kind in KNOWN}
CREATE_NAME = {
    "CreateModel": ("ModelName", "DescribeModel"),
    "CreateEndpointConfig": ("EndpointConfigName", "DescribeEndpointConfig"),
    "CreateEndpoint": ("EndpointName", "DescribeEndpoint"),
    "CreateOptimizationJob": ("OptimizationJobName", "DescribeOptimizationJob"),
}
LIST_TABLE = {
    "ListModels": ("models", True),
    "ListEndpointConfigs": ("endpoint_configs", True),
    "ListEndpoints": ("endpoints", True),
    "ListOptimizationJobs": ("optimization_jobs", False),  # default SortOrder Ascending
}
#: resources AddTags / ListTags / DeleteTags inputs name
TAGGABLE_ARNS = [f"arn:aws:sagemaker:us-east-1:123456789012:{kind}/{KNOWN[key][0]}"
                 for kind, key in (("model", "model"), ("endpoint-config", "config"),
                                   ("endpoint", "endpoint"), ("optimization-job", "job"))]
#: operations no valid input can make succeed here (no worker: endpoints stay Creating)
NEVER_SUCCEEDS = {"UpdateEndpoint", "UpdateEndpointWeightsAndCapacities"}


def _names(kind: str, *, victims: bool = False, known: bool = True) -> list[str]:
    return (KNOWN[kind] if known else []) + (VICTIMS[kind] if victims else [])


def _one_of_names(names: list[str]) -> Callable[[SearchStrategy[Any]], SearchStrategy[Any]]:
    return lambda base: st.one_of(st.sampled_from(names), base)


def _speculative_configs(base: SearchStrategy[Any]) -> SearchStrategy[Any]:
    eagle = st.fixed_dictionaries(
        {"Technique": st.just("EAGLE")},
        optional={"TrainingDataSource": st.fixed_dictionaries(
            {"S3Uri": st.sampled_from(["s3://data/train/", "s3://d/x.jsonl"]),
             "S3DataType": st.sampled_from(["S3Prefix", "ManifestFile"])})},
    )
    return st.one_of(
        base, st.lists(st.fixed_dictionaries({"ModelSpeculativeDecodingConfig": eagle}),
                       min_size=1, max_size=2))


def _model_sources(base: SearchStrategy[Any]) -> SearchStrategy[Any]:
    return st.one_of(
        base,
        st.sampled_from(_names("model")).map(lambda n: {"SageMakerModel": {"ModelName": n}}),
        st.sampled_from(["s3://models/a/", "s3://m/b"]).map(lambda u: {"S3": {"S3Uri": u}}),
    )


#: (botocore structure, member) -> how to bias its valid strategy towards useful values
OVERRIDES: dict[tuple[str, str], Callable[[SearchStrategy[Any]], SearchStrategy[Any]]] = {
    ("DescribeModelInput", "ModelName"): _one_of_names(_names("model", victims=True)),
    ("DeleteModelInput", "ModelName"): _one_of_names(_names("model", victims=True, known=False)),
    ("ProductionVariant", "ModelName"): _one_of_names(_names("model")),
    ("OptimizationSageMakerModel", "ModelName"): _one_of_names(_names("model")),
    ("DescribeEndpointConfigInput", "EndpointConfigName"):
        _one_of_names(_names("config", victims=True)),
    ("DeleteEndpointConfigInput", "EndpointConfigName"):
        _one_of_names(_names("config", victims=True, known=False)),
    ("CreateEndpointInput", "EndpointConfigName"): _one_of_names(_names("config")),
    ("UpdateEndpointInput", "EndpointConfigName"): _one_of_names(_names("config")),
    ("UpdateEndpointInput", "EndpointName"): _one_of_names(_names("endpoint")),
    ("UpdateEndpointWeightsAndCapacitiesInput", "EndpointName"):
        _one_of_names(_names("endpoint")),
    ("DescribeEndpointInput", "EndpointName"): _one_of_names(_names("endpoint", victims=True)),
    ("DeleteEndpointInput", "EndpointName"):
        _one_of_names(_names("endpoint", victims=True, known=False)),
    ("DescribeOptimizationJobRequest", "OptimizationJobName"):
        _one_of_names(_names("job", victims=True)),
    ("StopOptimizationJobRequest", "OptimizationJobName"):
        _one_of_names(_names("job", victims=True, known=False)),
    ("DeleteOptimizationJobRequest", "OptimizationJobName"):
        _one_of_names(_names("job", victims=True, known=False)),
    ("CreateOptimizationJobRequest", "OptimizationConfigs"): _speculative_configs,
    ("CreateOptimizationJobRequest", "ModelSource"): _model_sources,
    # AWS's rules beyond the shape: 1 GB memory steps, ProvisionedConcurrency <= MaxConcurrency
    ("ProductionVariantServerlessConfig", "MemorySizeInMB"):
        lambda _: st.sampled_from([1024, 2048, 3072, 4096, 5120, 6144]),
    ("ProductionVariantServerlessConfig", "ProvisionedConcurrency"): lambda _: st.just(1),
    **{(shape, "ResourceArn"): _one_of_names(TAGGABLE_ARNS)
       for shape in ("AddTagsInput", "ListTagsInput", "DeleteTagsInput")},
}

# ---------------------------------------------------------------------------------------
# Strategies from botocore shapes

_OFFSETS = st.timedeltas(min_value=-timedelta(hours=23, minutes=59),
                         max_value=timedelta(hours=23, minutes=59))
_MINUTES = st.integers(1, 23 * 60 + 59).map(lambda m: timedelta(minutes=m))


def _edge(moment: datetime, offset: timedelta) -> str:
    return moment.replace(tzinfo=timezone(offset)).isoformat()


#: the calendar's first and last instants in a UTC offset that keeps them in range ...
EDGES_IN_RANGE = st.one_of(st.builds(_edge, st.just(datetime.min), _MINUTES.map(lambda m: -m)),
                           st.builds(_edge, st.just(datetime.max), _MINUTES))
#: ... and in one that moves them out of it (before year 1 or after 9999 in UTC)
EDGES_OUT_OF_RANGE = st.one_of(st.builds(_edge, st.just(datetime.min), _MINUTES),
                               st.builds(_edge, st.just(datetime.max), _MINUTES.map(lambda m: -m)))
#: epoch seconds as botocore sends them, or ISO-8601 text (which the server also accepts)
TIMESTAMPS = st.one_of(
    st.integers(0, 4_102_444_800),
    st.floats(0, 4_102_444_800, allow_nan=False, allow_infinity=False),
    st.datetimes(timezones=st.builds(timezone, _OFFSETS)).map(datetime.isoformat),
    st.datetimes().map(datetime.isoformat),
    EDGES_IN_RANGE,
)

_NUMBER = st.one_of(st.integers(-10**6, 10**6),
                    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False))
_BOOL = st.booleans()
_LIST = st.one_of(st.just([]), st.lists(st.integers(0, 9), min_size=1, max_size=2))
_OBJ = st.one_of(st.just({}), st.dictionaries(st.sampled_from(["a", "B", "x1"]),
                                              st.integers(0, 9), min_size=1, max_size=2))
_TEXT = st.text(max_size=8)
#: not JSON at all, but Python's json module reads them: NaN, Infinity, and overflow (1e400)
_NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
WRONG_TYPE: dict[str, SearchStrategy[Any]] = {
    "string": st.one_of(_NUMBER, _BOOL, _LIST, _OBJ),
    "integer": st.one_of(_TEXT, st.floats(-1e6, 1e6).filter(lambda f: f != int(f)),
                         _BOOL, _LIST, _OBJ, _NON_FINITE),
    "float": st.one_of(_TEXT, _BOOL, _LIST, _OBJ, _NON_FINITE),
    "boolean": st.one_of(_TEXT, _NUMBER, _LIST, _OBJ),
    "timestamp": st.one_of(_BOOL, _LIST, _OBJ, _NON_FINITE, EDGES_OUT_OF_RANGE,
                           st.sampled_from(["not-a-timestamp", "", "2024-13-45", "1e3"])),
    "structure": st.one_of(_TEXT, _NUMBER, _BOOL, _LIST),
    "list": st.one_of(_TEXT, _NUMBER, _BOOL, _OBJ),
    "map": st.one_of(_TEXT, _NUMBER, _BOOL, _LIST),
}
WRONG_TYPE["long"] = WRONG_TYPE["integer"]
WRONG_TYPE["double"] = WRONG_TYPE["float"]

#: candidate pattern violations; each pattern keeps those it rejects (and whose length fits)
BAD_STRINGS = ("", " ", "-", "!", "a b", "a\n", "\n", "a\u2028b", "-a", "a-", "é", "__",
               "a/b", "s3:/x", "ftp://h/x", "arn:aws:iam::1:role/x", "\t", "a" * 70, "😀")
#: an unpaired surrogate: valid JSON escape, never valid text
SURROGATE = "\ud800x"
UNKNOWN_MEMBER = "FuzzUnknownMember"


class Strategies:
    """valid(shape) / invalid(shape) strategies, memoised per botocore shape name."""

    def __init__(self) -> None:
        self._valid: dict[str, SearchStrategy[Any]] = {}
        self._invalid: dict[str, SearchStrategy[Any]] = {}

    # -- valid ----------------------------------------------------------------------------

    def valid(self, shape: Shape) -> SearchStrategy[Any]:
        if shape.name not in self._valid:
            self._valid[shape.name] = self._build_valid(shape)
        return self._valid[shape.name]

    def member(self, owner: Shape, name: str) -> SearchStrategy[Any]:
        base = self.valid(owner.members[name])  # type: ignore[attr-defined]
        override = OVERRIDES.get((owner.name, name))
        return override(base) if override else base

    def _build_valid(self, shape: Shape) -> SearchStrategy[Any]:
        kind, meta = shape.type_name, shape.metadata
        if kind == "structure":
            members = list(shape.members)  # type: ignore[attr-defined]
            if meta.get("union"):
                return st.one_of([st.fixed_dictionaries({m: self.member(shape, m)})
                                  for m in members])
            required = set(shape.required_members)  # type: ignore[attr-defined]
            return st.fixed_dictionaries(
                {m: self.member(shape, m) for m in members if m in required},
                optional={m: self.member(shape, m) for m in members if m not in required},
            )
        if kind == "list":
            lo = meta.get("min", 0)
            return st.lists(self.valid(shape.member), min_size=lo,  # type: ignore[attr-defined]
                            max_size=min(meta.get("max", lo + 3), lo + 3))
        if kind == "map":
            lo = meta.get("min", 0)
            return st.dictionaries(
                self.valid(shape.key), self.valid(shape.value),  # type: ignore[attr-defined]
                min_size=lo, max_size=min(meta.get("max", lo + 3), lo + 3))
        if kind == "string":
            return self._valid_string(shape)
        if kind in ("integer", "long"):
            bits = 31 if kind == "integer" else 63
            return st.integers(meta.get("min", -(2**bits)), meta.get("max", 2**bits - 1))
        if kind in ("float", "double"):
            return st.floats(meta.get("min", -1e9), meta.get("max", 1e9),
                             allow_nan=False, allow_infinity=False)
        if kind == "boolean":
            return st.booleans()
        if kind == "timestamp":
            return TIMESTAMPS
        raise NotImplementedError(f"{shape.name}: botocore type {kind}")

    @staticmethod
    def _valid_string(shape: Shape) -> SearchStrategy[str]:
        meta = shape.metadata
        if "enum" in meta:
            return st.sampled_from(meta["enum"])
        lo, hi = meta.get("min", 0), meta.get("max", 10**6)
        pattern = meta.get("pattern")
        if pattern is None:
            return st.text(min_size=lo, max_size=min(hi, lo + 40))
        # Java semantics (the service's), to check what hypothesis makes from the pattern
        anchored = re.compile(java_to_python(pattern))
        if "\\p{" in pattern:  # python re has no \p{..}: generate from the translation
            source = st.from_regex(anchored, fullmatch=True)
        else:
            source = st.from_regex(re.compile(pattern, re.ASCII), fullmatch=True)
        return source.filter(lambda s: lo <= len(s) <= hi and anchored.match(s) is not None)

    def minimal(self, shape: Shape) -> SearchStrategy[Any]:
        """Valid values with required members only (small: room for a mutation)."""
        kind, meta = shape.type_name, shape.metadata
        if kind == "structure":
            members = list(shape.members)  # type: ignore[attr-defined]
            if meta.get("union"):
                return st.one_of([st.fixed_dictionaries({m: self.member(shape, m)})
                                  for m in members])
            return st.fixed_dictionaries({m: self.minimal_member(shape, m)
                                          for m in shape.required_members})  # type: ignore[attr-defined]
        if kind == "list":
            lo = meta.get("min", 0)
            return st.lists(self.minimal(shape.member), min_size=lo,  # type: ignore[attr-defined]
                            max_size=max(lo, 1))
        return self.valid(shape)

    def minimal_member(self, owner: Shape, name: str) -> SearchStrategy[Any]:
        if (owner.name, name) in OVERRIDES:
            return self.member(owner, name)
        return self.minimal(owner.members[name])  # type: ignore[attr-defined]

    # -- invalid --------------------------------------------------------------------------

    def invalid(self, shape: Shape) -> SearchStrategy[Any]:
        if shape.name not in self._invalid:
            # `.map(_same)` keeps each kind of defect one branch of one_of: one_of flattens
            # nested one_ofs, and the many wrong-type leaves would crowd out the rest.
            self._invalid[shape.name] = st.one_of(
                [d.map(_same) for d in (WRONG_TYPE[shape.type_name], *self.defects(shape))])
        return self._invalid[shape.name]

    def defects(self, shape: Shape) -> list[SearchStrategy[Any]]:
        """Values of the right JSON type that break one of the shape's constraints."""
        kind, meta = shape.type_name, shape.metadata
        lo, hi = meta.get("min"), meta.get("max")
        if kind == "structure":
            return self._structure_defects(shape)
        if kind == "string":
            return self._string_defects(shape)
        if kind in ("integer", "long"):
            out = []
            if lo is not None:
                out.append(st.integers(lo - 10**6, lo - 1))
            if hi is not None:
                out.append(st.integers(hi + 1, hi + 10**6))
            return out
        if kind in ("float", "double"):
            out = []
            if lo is not None:
                out.append(st.floats(lo - 1e6, lo, exclude_max=True))
            if hi is not None:
                out.append(st.floats(hi, hi + 1e6, exclude_min=True))
            return out
        if kind == "list":
            return self._list_defects(shape)
        if kind == "map":
            return self._map_defects(shape)
        return []  # boolean, timestamp: only wrong types

    def _string_defects(self, shape: Shape) -> list[SearchStrategy[Any]]:
        meta = shape.metadata
        lo, hi = meta.get("min", 0), meta.get("max")
        out: list[SearchStrategy[Any]] = [st.just(SURROGATE)]
        if "enum" in meta:
            enum = meta["enum"]
            bad = [f"{enum[0]}x", enum[0].swapcase(), "", "NOT_AN_ENUM", f" {enum[0]}"]
            out.append(st.sampled_from([b for b in bad if b not in enum]))
        if "pattern" in meta:
            anchored = re.compile(java_to_python(meta["pattern"]))
            bad = [s for s in BAD_STRINGS
                   if anchored.match(s) is None and lo <= len(s) <= (hi or 10**6)]
            if bad:
                out.append(st.sampled_from(bad))
        if lo > 0:
            out.append(st.text(max_size=lo - 1))
        if hi is not None:
            out.append(st.integers(1, 3).map(lambda k: "a" * (hi + k)))
        return out

    def _list_defects(self, shape: Shape) -> list[SearchStrategy[Any]]:
        meta = shape.metadata
        item = self.valid(shape.member)  # type: ignore[attr-defined]
        out: list[SearchStrategy[Any]] = [
            st.tuples(st.lists(item, max_size=1), self.invalid(shape.member),  # type: ignore[attr-defined]
                      st.lists(item, max_size=1)).map(lambda t: [*t[0], t[1], *t[2]])
        ]
        if meta.get("min", 0) > 0:
            out.append(st.lists(item, max_size=meta["min"] - 1))
        if "max" in meta and meta["max"] <= 1000:
            out.append(item.map(lambda x, n=meta["max"] + 1: [x] * n))
        return out

    def _map_defects(self, shape: Shape) -> list[SearchStrategy[Any]]:
        key, value = shape.key, shape.value  # type: ignore[attr-defined]
        out: list[SearchStrategy[Any]] = [
            st.tuples(self.valid(key), self.invalid(value)).map(lambda kv: {kv[0]: kv[1]}),
        ]
        key_defects = self._string_defects(key)  # JSON keys are always strings: no wrong type
        out.append(st.tuples(st.one_of(key_defects), self.valid(value))
                   .map(lambda kv: {kv[0]: kv[1]}))
        hi = shape.metadata.get("max")
        key_ok = re.compile(java_to_python(key.metadata.get("pattern", ".*")))
        if hi is not None and key_ok.match("K0"):
            out.append(self.valid(value).map(lambda v: {f"K{i}": v for i in range(hi + 1)}))
        return out

    def _structure_defects(self, shape: Shape) -> list[SearchStrategy[Any]]:
        members = list(shape.members)  # type: ignore[attr-defined]
        union = bool(shape.metadata.get("union"))
        required = [] if union else list(shape.required_members)  # type: ignore[attr-defined]

        def others(skip: str, extra: dict[str, SearchStrategy[Any]]) -> SearchStrategy[Any]:
            if union:
                return st.fixed_dictionaries(extra)
            return st.fixed_dictionaries(
                {**{m: self.member(shape, m) for m in required if m != skip}, **extra},
                optional={m: self.member(shape, m)
                          for m in members if m not in required and m != skip},
            )

        out = []
        for m in required:  # missing, or explicitly null
            out.append(others(m, {}))
            out.append(others(m, {m: st.none()}))
        if union:
            out.append(st.just({}))
            pairs = list(itertools.combinations(members, 2))
            if pairs:
                out.append(st.sampled_from(pairs).flatmap(
                    lambda p: st.fixed_dictionaries({m: self.member(shape, m) for m in p})))
        for m in members:  # one member broken, everything else valid
            out.append(others(m, {m: self.invalid(shape.members[m])}))  # type: ignore[attr-defined]
        return out


def _same(value: Any) -> Any:
    return value


STRATEGIES = Strategies()

#: bodies that are no JSON object at all
RAW_GARBAGE = [b"{not json", b"", b"[]", b"null", b'"x"', b"42", b'{"a":', b"\xff\xfe{}",
               b"{}}", b"NaN"]


def _forged_tokens(op: str) -> SearchStrategy[dict[str, Any]]:
    """NextTokens built the way the server builds them (right fingerprint), hostile values."""
    table, descending = LIST_TABLE[op]
    fp = fingerprint(table=table, sort="CreationTime", desc=descending, name=None, ca=None,
                     cb=None, ma=None, mb=None, st=None, ty=None)
    values = st.one_of(st.none(), st.booleans(), st.text(max_size=4), _NUMBER,
                       st.integers(-(2**80), 2**80), _LIST, _OBJ, _NON_FINITE)
    ids = st.one_of(st.integers(-5, 5), st.integers(2**63, 2**80), st.text(max_size=3),
                    st.floats(-10, 10), _LIST)

    def token(v: Any, i: Any) -> dict[str, Any]:
        return {"NextToken": page_tokens.encode([v, i], fp)}

    return st.builds(token, values, ids)


def valid_bodies(op: str) -> SearchStrategy[bytes]:
    shape = SAGEMAKER.operation_model(op).input_shape
    inputs: SearchStrategy[Any] = STRATEGIES.valid(shape)
    if op == "CreateEndpointConfig":  # make the service's own variant checks pass too
        inputs = st.one_of(inputs, inputs.map(_deployable_variants))
    if op in LIST_TABLE:
        inputs = st.one_of(inputs, _forged_tokens(op))
    inputs = st.one_of(inputs, st.tuples(inputs, st.integers(0, 50)).map(
        functools.partial(_with_unknown_member, shape)))
    return inputs.map(lambda body: json.dumps(body).encode())


def _with_unknown_member(shape: Shape, drawn: tuple[Any, int]) -> Any:
    """The drawn body with a member no shape has, in one of its structures (the int picks)."""
    body, pick = copy.deepcopy(drawn[0]), drawn[1]
    structures: list[dict[str, Any]] = []

    def walk(where: Shape, value: Any) -> None:
        kind = where.type_name
        if kind == "structure" and isinstance(value, dict):
            structures.append(value)
            for name, member in where.members.items():  # type: ignore[attr-defined]
                if name in value:
                    walk(member, value[name])
        elif kind == "list" and isinstance(value, list):
            for item in value:
                walk(where.member, item)  # type: ignore[attr-defined]
        elif kind == "map" and isinstance(value, dict):
            for item in value.values():
                walk(where.value, item)  # type: ignore[attr-defined]

    walk(shape, body)
    if structures:
        structures[pick % len(structures)][UNKNOWN_MEMBER] = "x"
    return body


NUMERIC = ("float", "double", "integer", "long", "timestamp")


def _number_slots(shape: Shape, value: Any, path: tuple[Any, ...] = ()
                  ) -> Iterator[tuple[tuple[Any, ...], str, str]]:
    """(path of a structure in `value`, member, its botocore type) for every numeric member
    that structure's shape has, set or not."""
    if shape.type_name == "structure" and isinstance(value, dict):
        for name, child in shape.members.items():  # type: ignore[attr-defined]
            if child.type_name in NUMERIC:
                yield path, name, child.type_name
            elif name in value:
                yield from _number_slots(child, value[name], (*path, name))
    elif shape.type_name == "list" and isinstance(value, list):
        for index, item in enumerate(value):
            yield from _number_slots(shape.member, item, (*path, index))  # type: ignore[attr-defined]
    elif shape.type_name == "map" and isinstance(value, dict):
        for key, item in value.items():
            yield from _number_slots(shape.value, item, (*path, key))  # type: ignore[attr-defined]


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


def _non_finite_number(shape: Shape) -> SearchStrategy[Any]:
    """A valid body with one numeric member (a float one if there is) NaN or +-Infinity."""

    def mutate(body: Any, pick: int, constant: float) -> Any:
        body = copy.deepcopy(body)
        slots = list(_number_slots(shape, body))
        slots = [s for s in slots if s[2] in ("float", "double")] or slots
        if not slots:
            return {**body, UNKNOWN_MEMBER: constant}
        path, member, _ = slots[pick % len(slots)]
        _at(body, path)[member] = constant
        return body

    bodies = st.one_of(STRATEGIES.minimal(shape), STRATEGIES.valid(shape))
    return st.builds(mutate, bodies, st.integers(0, 50), _NON_FINITE)


def invalid_bodies(op: str) -> SearchStrategy[bytes]:
    """One defect per body; a body that is no JSON object is one branch among the rest."""
    shape = SAGEMAKER.operation_model(op).input_shape
    not_an_object = st.one_of(
        WRONG_TYPE["structure"].map(lambda body: json.dumps(body).encode()),
        st.sampled_from(RAW_GARBAGE))
    shape_defects = st.one_of([d.map(_same) for d in STRATEGIES.defects(shape)])
    encoded = shape_defects.map(lambda body: json.dumps(body).encode())
    return st.one_of(*[encoded.map(_same) for _ in range(3)], not_an_object.map(_same))


def non_finite_bodies(op: str) -> SearchStrategy[bytes]:
    shape = SAGEMAKER.operation_model(op).input_shape
    return _non_finite_number(shape).map(lambda body: json.dumps(body).encode())


def _deployable_variants(body: dict[str, Any]) -> dict[str, Any]:
    """Distinct variant names, a known model and an instance type (or serverless) each."""
    body = copy.deepcopy(body)  # never mutate what hypothesis drew
    variants = body["ProductionVariants"] + body.get("ShadowProductionVariants", [])
    for i, variant in enumerate(variants):
        variant["VariantName"] = f"v{i}"
        variant["ModelName"] = KNOWN["model"][i % len(KNOWN["model"])]
        if "ServerlessConfig" not in variant:
            variant.setdefault("InstanceType", "ml.m5.large")
    return body


COUNTER = itertools.count()


def unique_name(generated: str) -> str:
    """Prefix a generated (pattern-valid) name so that creates never collide."""
    prefix = f"fz{next(COUNTER)}-"
    return prefix + generated[-(63 - len(prefix)):]


# ---------------------------------------------------------------------------------------
# Checks


def _reject_constant(token: str) -> None:
    raise ValueError(f"non-JSON constant {token}")


def strict_json(text: str) -> Any:
    """json.loads that refuses NaN / Infinity (botocore's parser does not read them)."""
    return json.loads(text, parse_constant=_reject_constant)


def _member_names(shape: Shape, seen: set[str] | None = None) -> set[str]:
    seen = set() if seen is None else seen
    if shape.name in seen:
        return set()
    seen.add(shape.name)
    names: set[str] = set()
    if shape.type_name == "structure":
        for name, child in shape.members.items():  # type: ignore[attr-defined]
            names.add(name.lower())
            names |= _member_names(child, seen)
    elif shape.type_name == "list":
        names |= _member_names(shape.member, seen)  # type: ignore[attr-defined]
    elif shape.type_name == "map":
        names |= _member_names(shape.value, seen)  # type: ignore[attr-defined]
    return names


MEMBER_NAMES = {op: _member_names(SAGEMAKER.operation_model(op).input_shape)
                for op in OPERATIONS}
#: what an error message may name instead of a member: the resource, the token, the body
NOUNS = ("model", "endpoint", "optimization job", "variant", "nexttoken", "request body",
         "pagination token")
LEAKS = ("Traceback", 'File "', "pydantic", "input_value", "type=", "errors.pydantic.dev")


def names_something(op: str, message: str) -> bool:
    lower = message.lower()
    if re.search(r"'[^']+'|\"[^\"]+\"", message):
        return True
    return any(n in lower for n in MEMBER_NAMES[op]) or any(n in lower for n in NOUNS)


class Database:
    """Read-only view of the stack's SQLite file: has anything been committed since?"""

    def __init__(self, stack: Stack) -> None:
        path = stack.data_dir / "eaglenest.db"
        self.conn = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True,
                                    isolation_level=None, check_same_thread=False)

    def version(self) -> int:
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def signature(self) -> dict[str, tuple[Any, ...]]:
        """Row count, max id and the mutable columns' aggregate, per table."""
        out = {}
        for table in TABLES:
            extra = ", total(last_modified_time), group_concat(status)" \
                if table in ("endpoints", "optimization_jobs") else ""
            out[table] = tuple(self.conn.execute(
                f"SELECT count(*), max(id), total(creation_time){extra} FROM {table}"
            ).fetchone())
        return out

    def close(self) -> None:
        self.conn.close()


class Fuzzer:
    def __init__(self, post: Callable[[str, bytes], httpx.Response], db: Database) -> None:
        self.post = post
        self.db = db

    def call(self, op: str, body: bytes) -> httpx.Response:
        """Send one request and check every invariant that holds for any input."""
        version, before = self.db.version(), self.db.signature()
        r = self.post(f"SageMaker.{op}", body)
        where = f"{op} {body[:3000]!r} -> {r.status_code} {r.text[:2000]}"
        assert r.status_code < 500 and r.status_code != 429, where
        try:
            data = strict_json(r.text)
        except ValueError as exc:
            raise AssertionError(f"response is not strict JSON ({exc}): {where}") from None
        assert isinstance(data, dict), where
        if r.status_code >= 400:
            assert set(data) == {"__type", "message"}, where
            assert data["__type"] != "InternalFailure", where  # ResponseValidationError
            message = data["message"]
            assert isinstance(message, str) and message.strip(), where
            for leak in LEAKS:
                assert leak not in message, f"{leak!r} leaked: {where}"
            assert names_something(op, message), f"message names nothing: {where}"
            after = self.db.signature()
            assert after == before, f"rejected call changed the database {before}->{after}: {where}"
            assert self.db.version() == version, f"rejected call committed: {where}"
        return r


# ---------------------------------------------------------------------------------------
# Fixtures and tests


@pytest.fixture(scope="module")
def world(sm) -> None:  # type: ignore[no-untyped-def]
    """The resources fuzzed inputs refer to (KNOWN) or may delete / stop (VICTIMS)."""
    for name in KNOWN["model"] + VICTIMS["model"]:
        sm.create_model(ModelName=name, ExecutionRoleArn=ROLE, PrimaryContainer={"Image": "x"})
    for name in KNOWN["config"] + VICTIMS["config"]:
        sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
            "VariantName": "v", "ModelName": KNOWN["model"][0],
            "InstanceType": "ml.m5.large", "InitialInstanceCount": 1}])
    for name in KNOWN["endpoint"] + VICTIMS["endpoint"]:
        sm.create_endpoint(EndpointName=name, EndpointConfigName=KNOWN["config"][0])
    for name in KNOWN["job"] + VICTIMS["job"]:
        sm.create_optimization_job(
            OptimizationJobName=name, RoleArn=ROLE,
            ModelSource={"SageMakerModel": {"ModelName": KNOWN["model"][0]}},
            DeploymentInstanceType="ml.g5.2xlarge",
            OptimizationConfigs=[{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
            OutputConfig={"S3OutputLocation": "s3://out/"},
            StoppingCondition={"MaxRuntimeInSeconds": 60})


@pytest.fixture(scope="module")
def fuzzer(stack: Stack, signed_post, world) -> Iterator[Fuzzer]:  # type: ignore[no-untyped-def]
    db = Database(stack)
    yield Fuzzer(signed_post, db)
    db.close()


@pytest.mark.parametrize("op", OPERATIONS)
def test_valid_inputs(op: str, fuzzer: Fuzzer) -> None:
    """Valid inputs: shape validation never rejects them, creates can be described."""
    outcomes: Counter[str] = Counter()

    @fuzz_settings(MAX_VALID)
    @given(valid_bodies(op))
    def run(body: bytes) -> None:
        if op in CREATE_NAME:
            member, describe = CREATE_NAME[op]
            data = json.loads(body)
            data[member] = unique_name(data[member])
            body = json.dumps(data).encode()
        r = fuzzer.call(op, body)
        code = "OK" if r.status_code == 200 else r.json()["__type"]
        outcomes[code] += 1
        if r.status_code != 200:
            message = r.json()["message"]
            where = f"{op} {body[:3000]!r} -> {r.text[:2000]}"
            assert code != "SerializationException", where
            assert "failed to satisfy constraint" not in message, where
        elif op in CREATE_NAME:
            described = fuzzer.call(describe, json.dumps({member: data[member]}).encode())
            assert described.status_code == 200, described.text

    run()
    if op not in NEVER_SUCCEEDS:
        assert outcomes["OK"] > 0, f"no valid {op} input succeeded: {dict(outcomes)}"


@pytest.mark.parametrize("op", OPERATIONS)
def test_invalid_inputs(op: str, fuzzer: Fuzzer) -> None:
    """Invalid inputs: always a 400 ValidationException / SerializationException."""

    @fuzz_settings(MAX_INVALID)
    @given(invalid_bodies(op))
    def run(body: bytes) -> None:
        r = fuzzer.call(op, body)
        where = f"{op} {body[:3000]!r} -> {r.status_code} {r.text[:2000]}"
        assert r.status_code == 400, where
        assert r.json()["__type"] in ("ValidationException", "SerializationException"), where

    run()


@pytest.mark.parametrize("op", OPERATIONS)
def test_non_finite_numbers(op: str, fuzzer: Fuzzer) -> None:
    """NaN / Infinity / 1e400 are no JSON numbers: SerializationException, never stored."""

    @fuzz_settings(MAX_NON_FINITE)
    @given(non_finite_bodies(op), st.booleans())
    def run(body: bytes, overflow: bool) -> None:
        if overflow:  # the same, spelled as a number that overflows a double
            body = body.replace(b"-Infinity", b"-1e400").replace(b"Infinity", b"1e400")
        r = fuzzer.call(op, body)
        where = f"{op} {body[:3000]!r} -> {r.status_code} {r.text[:2000]}"
        assert r.status_code == 400, where
        assert r.json()["__type"] == "SerializationException", where

    run()


def _token(table: str, descending: bool, value: Any, row_id: Any) -> str:
    fp = fingerprint(table=table, sort="CreationTime", desc=descending, name=None, ca=None,
                     cb=None, ma=None, mb=None, st=None, ty=None)
    return page_tokens.encode([value, row_id], fp)


#: what this fuzzer found: 500s (forged NextTokens reaching SQL, timestamps whose UTC value
#: leaves datetime's range) and a 200 that stored Infinity (then sent back as non-JSON)
FOUND = [
    ("ListModels", {"NextToken": _token("models", True, [], 0)}),
    ("ListEndpoints", {"NextToken": _token("endpoints", True, None, 2**63)}),
    # a string for a float column: 200 on SQLite, a 500 (ProgrammingError) on Postgres
    ("ListOptimizationJobs", {"NextToken": _token("optimization_jobs", False, "x", 1)}),
    ("ListModels", {"CreationTimeBefore": "0001-01-01T00:00:00+00:01"}),
    ("ListModels", {"CreationTimeAfter": "9999-12-31T23:59:59-01:00"}),
    ("CreateEndpointConfig", {"EndpointConfigName": "fz-found-inf", "ProductionVariants": [{
        "VariantName": "v", "ModelName": KNOWN["model"][0], "InstanceType": "ml.m5.large",
        "InitialVariantWeight": math.inf}]}),
]


@pytest.mark.parametrize(("op", "body"), FOUND, ids=[f"{op}-{i}" for i, (op, _) in
                                                     enumerate(FOUND)])
def test_found_by_fuzzing(op: str, body: dict[str, Any], fuzzer: Fuzzer) -> None:
    r = fuzzer.call(op, json.dumps(body).encode())
    assert r.status_code == 400, r.text
    assert r.json()["__type"] in ("ValidationException", "SerializationException"), r.text


def test_timestamps_at_the_edges_of_the_calendar_in_range(fuzzer: Fuzzer) -> None:
    edge = datetime(9999, 12, 31, 23, 59, tzinfo=UTC).isoformat()
    r = fuzzer.call("ListModels", json.dumps({"CreationTimeBefore": edge}).encode())
    assert r.status_code == 200, r.text
