"""Every control-plane handler takes its operation's generated input class and returns its
generated output class: the registry refuses a handler typed otherwise, so the shape the
protocol parses, the handler and the reply agree. Every operation of the codegen lists has
a handler and a test."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import get_type_hints

import pytest
from botocore import xform_name

from eaglenest.api.cloudwatch import SERVICE as CLOUDWATCH
from eaglenest.api.edge.json_protocol import SERVICES
from eaglenest.api.edge.registry import Context, JsonService
from eaglenest.api.sagemaker import SERVICE as SAGEMAKER
from eaglenest.api.tagging import SERVICE as TAGGING
from eaglenest.foundation.shapes import _codegen
from eaglenest.foundation.shapes.models import (
    CreateModelInput,
    DescribeModelInput,
    DescribeModelOutput,
)

TESTS = Path(__file__).resolve().parents[1]
#: each service, the operations its codegen list names, and the folder of its tests
COVERED = [
    (SAGEMAKER, _codegen.operations(), TESTS / "sagemaker"),
    (TAGGING, _codegen.TAGGING_OPERATIONS, TESTS / "tagging"),
    (CLOUDWATCH, _codegen.CLOUDWATCH_OPERATIONS, TESTS / "cloudwatch"),
]


def client_calls(sources: Iterable[str]) -> set[str]:
    """The method names called in these test modules (`.list_endpoint_configs(`): a test
    of an operation calls it through a boto3 client, by its snake_case name."""
    return {name for text in sources for name in re.findall(r"\.([a-z][a-z0-9_]*)\(", text)}


def uncovered(operations: Iterable[str], service: JsonService, sources: Iterable[str]
              ) -> list[str]:
    """The operations without a registered handler or a boto3 call in `sources`."""
    called = client_calls(sources)
    return [f"{op}: no handler" if op not in service.handlers else f"{op}: no test"
            for op in operations
            if op not in service.handlers or xform_name(op) not in called]


def test_services_are_the_ones_served() -> None:
    assert [s.signing_name for s in SERVICES] == ["sagemaker", "tagging", "monitoring"]


@pytest.mark.parametrize(("service", "operations", "folder"), COVERED,
                         ids=[s.signing_name for s, _, _ in COVERED])
def test_every_codegen_operation_has_a_handler_and_a_test(
    service: JsonService, operations: tuple[str, ...], folder: Path
) -> None:
    sources = [p.read_text("utf-8") for p in sorted(folder.glob("test_*.py"))]
    assert uncovered(operations, service, sources) == []
    assert set(service.handlers) == set(operations) == set(service.inputs)


def test_the_coverage_check_fails_without_a_handler_or_a_test() -> None:
    ops = ("DescribeModel", "ListModels")
    tested = ["sm.describe_model(ModelName=x)", "sm.list_models()"]
    assert uncovered(ops, SAGEMAKER, tested) == []
    assert uncovered(ops, SAGEMAKER, tested[:1]) == ["ListModels: no test"]
    lacking = JsonService("sagemaker", "SageMaker.")
    assert uncovered(ops, lacking, tested) == ["DescribeModel: no handler",
                                               "ListModels: no handler"]


@pytest.mark.parametrize("service", SERVICES, ids=lambda s: s.signing_name)
def test_every_handler_takes_its_input_and_returns_its_output(service: JsonService) -> None:
    for name, handler in service.handlers.items():
        hints = get_type_hints(handler)
        assert hints["req"] is service.inputs[name], name
        assert hints["return"] is (service.outputs[name] or type(None)), name


def test_a_handler_typed_with_another_shape_is_refused() -> None:
    service = JsonService("sagemaker", "SageMaker.")

    def describe(ctx: Context, req: CreateModelInput) -> DescribeModelOutput:
        raise NotImplementedError

    with pytest.raises(TypeError, match="describe must take req: DescribeModelInput"):
        service.operation("DescribeModel")(describe)

    def describe_untyped(ctx: Context, req: DescribeModelInput) -> dict[str, str]:
        raise NotImplementedError

    with pytest.raises(TypeError, match="describe_untyped must return DescribeModelOutput"):
        service.operation("DescribeModel")(describe_untyped)

    def describe_right(ctx: Context, req: DescribeModelInput) -> DescribeModelOutput:
        raise NotImplementedError

    assert service.operation("DescribeModel")(describe_right) is describe_right
    assert {"DescribeModel": describe_right} == service.handlers
    with pytest.raises(RuntimeError, match="registered twice"):
        service.operation("DescribeModel")(describe_right)
