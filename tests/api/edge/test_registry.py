"""Every control-plane handler takes its operation's generated input class: the registry
refuses a handler typed otherwise, so the shape the protocol parses is the one it gets."""

from __future__ import annotations

from typing import Any, get_type_hints

import pytest

from eaglenest.api.edge import (
    json_protocol,  # noqa: F401  (registers the handlers)
    registry,
)
from eaglenest.api.edge.registry import REGISTRY, Context, operation
from eaglenest.foundation.shapes import INPUT_SHAPES
from eaglenest.foundation.shapes.models import CreateModelInput, DescribeModelInput


def test_every_operation_has_a_handler_taking_its_input_shape():
    assert set(REGISTRY) == set(INPUT_SHAPES)
    for name, handler in REGISTRY.items():
        assert get_type_hints(handler)["req"] is INPUT_SHAPES[name], name


def test_a_handler_typed_with_another_shape_is_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(registry, "REGISTRY", {})

    def describe(ctx: Context, req: CreateModelInput) -> dict[str, Any]:
        return {}

    with pytest.raises(TypeError, match="describe must take req: DescribeModelInput"):
        operation("DescribeModel")(describe)

    def describe_right(ctx: Context, req: DescribeModelInput) -> dict[str, Any]:
        return {}

    assert operation("DescribeModel")(describe_right) is describe_right
    assert {"DescribeModel": describe_right} == registry.REGISTRY
