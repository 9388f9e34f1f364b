"""CloudWatch's generated shapes (foundation/shapes/cloudwatch.py, written by
foundation/shapes/_codegen.py from botocore's model) and the handlers registered for them."""

from __future__ import annotations

import botocore.session
import pytest
from pydantic import ValidationError

from eaglenest.api.cloudwatch import SERVICE
from eaglenest.foundation import shapes
from eaglenest.foundation.shapes import _codegen, cloudwatch

MODEL = botocore.session.get_session().get_service_model("cloudwatch")


def test_tables_name_botocores_shapes_and_every_operation_has_a_handler():
    assert shapes.SERVICES["monitoring"] == (cloudwatch.INPUT_SHAPES, cloudwatch.OUTPUT_SHAPES)
    assert tuple(cloudwatch.INPUT_SHAPES) == _codegen.CLOUDWATCH_OPERATIONS
    for op in _codegen.CLOUDWATCH_OPERATIONS:
        op_model = MODEL.operation_model(op)
        assert cloudwatch.INPUT_SHAPES[op].__name__ == op_model.input_shape.name
        output = cloudwatch.OUTPUT_SHAPES[op]
        assert output is not None and output.__name__ == op_model.output_shape.name
    assert sorted(SERVICE.handlers) == sorted(_codegen.CLOUDWATCH_OPERATIONS)


def test_the_generated_module_is_fresh():
    assert _codegen.render()["cloudwatch.py"] == (
        _codegen.OUT_DIR / "cloudwatch.py").read_text("utf-8")


def test_shapes_forbid_unknown_members_and_keep_the_models_limits():
    with pytest.raises(ValidationError):
        cloudwatch.Dimension.model_validate({"Name": "a", "Value": "b", "Extra": 1})
    with pytest.raises(ValidationError):
        cloudwatch.ListMetricsInput.model_validate(
            {"Dimensions": [{"Name": f"d{i}"} for i in range(11)]})
    req = shapes.parse_input("ListMetrics", {"Namespace": "AWS/SageMaker"},
                             service="monitoring")
    assert isinstance(req, cloudwatch.ListMetricsInput) and req.Namespace == "AWS/SageMaker"
