"""Workers rebuild stored requests through the generated shapes: what the API stores
(``to_wire`` of the parsed request) rebuilds to the same request, and a stored request the
shapes no longer accept is refused with a reason naming the shape and the member."""

from __future__ import annotations

import pytest

from eaglenest.foundation.shapes import StoredShapeError, parse_input, rebuild, to_wire
from eaglenest.foundation.shapes.optimization_jobs import CreateOptimizationJobRequest

BODY = {
    "OptimizationJobName": "job-1",
    "RoleArn": "arn:aws:iam::123456789012:role/r",
    "ModelSource": {"S3": {"S3Uri": "s3://bucket/model/"}},
    "DeploymentInstanceType": "ml.g5.2xlarge",
    "OptimizationEnvironment": {"EAGLENEST_MAX_STEPS": "4"},
    "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
    "OutputConfig": {"S3OutputLocation": "s3://bucket/out/"},
    "StoppingCondition": {"MaxRuntimeInSeconds": 600},
}


def test_a_stored_request_rebuilds_to_the_parsed_one():
    stored = to_wire(parse_input("CreateOptimizationJob", BODY))
    assert stored == BODY  # what the database keeps: the members as set
    job = rebuild(CreateOptimizationJobRequest, stored)
    assert job == parse_input("CreateOptimizationJob", BODY)
    assert job.ModelSource.S3 is not None and job.ModelSource.S3.S3Uri == "s3://bucket/model/"
    assert job.StoppingCondition.MaxRuntimeInSeconds == 600


def test_a_stored_request_the_shapes_refuse_names_the_member():
    stored = {**BODY, "StoppingCondition": {"MaxRuntimeInSeconds": "soon"}}
    with pytest.raises(StoredShapeError) as exc:
        rebuild(CreateOptimizationJobRequest, stored)
    message = str(exc.value)
    assert message.startswith("the stored CreateOptimizationJobRequest no longer validates: ")
    assert message.endswith("stoppingCondition.maxRuntimeInSeconds': expected integer, got string")
