"""foundation.shapes: the pydantic shapes held against botocore's own SageMaker model.

Pure unit tests (no server). The expected shapes, members, enums and constraints are read
from botocore at test time; the generated modules must match a fresh generator run.
"""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import botocore.session
import pytest
from botocore.model import ServiceModel, Shape
from pydantic import BaseModel, Field

from eaglenest.foundation import shapes
from eaglenest.foundation.errors import (
    InternalFailure,
    SerializationException,
    UnknownOperationException,
    ValidationException,
)
from eaglenest.foundation.shapes import (
    INPUT_SHAPES,
    OUTPUT_SHAPES,
    _codegen,
    endpoint_configs,
    endpoints,
    models,
    optimization_jobs,
    shared,
    tags,
)
from eaglenest.foundation.shapes.base import (
    ORIGINAL_PATTERNS,
    AwsShape,
    AwsTimestamp,
    AwsUnion,
    aws_pattern,
    constraints,
    java_to_python,
    unwrap,
)

#: the operations the shapes are generated for: the codegen list itself
OPERATIONS = list(_codegen.operations())
SHAPES_DIR = Path(shapes.__file__).parent
SAGEMAKER: ServiceModel = botocore.session.get_session().get_service_model("sagemaker")
CLASSES: dict[str, type[AwsShape]] = {
    name: value
    for module in (shared, models, endpoint_configs, endpoints, optimization_jobs, tags)
    for name, value in vars(module).items()
    if isinstance(value, type)
    and issubclass(value, AwsShape)
    and value.__module__ == module.__name__
    and name == value.__name__
}


def botocore_closure() -> dict[str, Shape]:
    """Every shape reachable from the codegen operations, straight from botocore."""
    found: dict[str, Shape] = {}
    todo = [
        shape
        for op in OPERATIONS
        for shape in (
            SAGEMAKER.operation_model(op).input_shape,
            SAGEMAKER.operation_model(op).output_shape,
        )
        if shape is not None
    ]
    while todo:
        shape = todo.pop()
        if shape.name in found:
            continue
        found[shape.name] = shape
        if shape.type_name == "structure":
            todo += shape.members.values()
        elif shape.type_name == "list":
            todo.append(shape.member)
        elif shape.type_name == "map":
            todo += [shape.key, shape.value]
    return found


CLOSURE = botocore_closure()
STRUCTURES = sorted(name for name, s in CLOSURE.items() if s.type_name == "structure")


def wire_fields(cls: type[BaseModel]) -> dict[str, Any]:
    return {info.alias or name: info for name, info in cls.model_fields.items()}


def expected_limits(meta: dict[str, Any], length: bool) -> dict[str, Any]:
    low, high = ("min_length", "max_length") if length else ("ge", "le")
    limits = {low: meta.get("min"), high: meta.get("max")}
    return {k: v for k, v in limits.items() if v is not None}


def assert_type_matches(annotation: Any, metadata: tuple[Any, ...], shape: Shape) -> None:
    """The (unwrapped) annotation carries exactly ``shape``'s type and constraints."""
    base, found = unwrap(annotation, metadata)
    limits = constraints(found)
    meta, kind = shape.metadata, shape.type_name
    if kind == "structure":
        assert base is CLASSES[shape.name] and limits == {}
    elif kind == "string" and "enum" in meta:
        assert get_origin(base) is Literal and list(get_args(base)) == meta["enum"]
    elif kind == "string":
        pattern = limits.pop("pattern", None)
        assert base is str
        assert (ORIGINAL_PATTERNS[pattern] if pattern else None) == meta.get("pattern")
        assert limits == expected_limits(meta, length=True)
    elif kind in ("integer", "long", "float", "double"):
        assert base is (int if kind in ("integer", "long") else float)
        assert limits == expected_limits(meta, length=False)
    elif kind in ("boolean", "timestamp"):
        assert base is (bool if kind == "boolean" else datetime) and limits == {}
    elif kind == "list":
        assert get_origin(base) is list and limits == expected_limits(meta, length=True)
        assert_type_matches(get_args(base)[0], (), shape.member)
    elif kind == "map":
        assert get_origin(base) is dict and limits == expected_limits(meta, length=True)
        assert_type_matches(get_args(base)[0], (), shape.key)
        assert_type_matches(get_args(base)[1], (), shape.value)
    else:
        pytest.fail(f"unexpected botocore type {kind} for {shape.name}")


# --------------------------------------------------------------------------- structure


def test_closure_size() -> None:
    assert len(STRUCTURES) >= 100
    assert sum(len(CLOSURE[name].members) for name in STRUCTURES) >= 390
    assert set(STRUCTURES) == set(CLASSES)


@pytest.mark.parametrize("name", STRUCTURES)
def test_structure_matches_botocore(name: str) -> None:
    shape = CLOSURE[name]
    cls = CLASSES[name]
    fields = wire_fields(cls)
    assert list(fields) == list(shape.members)
    required = {member for member, info in fields.items() if info.is_required()}
    assert required == set(shape.required_members)
    assert issubclass(cls, AwsUnion) == bool(shape.metadata.get("union"))
    for member, member_shape in shape.members.items():
        info = fields[member]
        assert_type_matches(info.annotation, tuple(info.metadata), member_shape)


def test_registry_names_botocore_shapes() -> None:
    assert list(INPUT_SHAPES) == OPERATIONS == list(OUTPUT_SHAPES)
    for op in OPERATIONS:
        op_model = SAGEMAKER.operation_model(op)
        assert INPUT_SHAPES[op].__name__ == op_model.input_shape.name
        output = OUTPUT_SHAPES[op]
        if op_model.output_shape is None:
            assert output is None
        else:
            assert output is not None and output.__name__ == op_model.output_shape.name


def test_generated_modules_are_up_to_date(tmp_path: Path) -> None:
    written = _codegen.write(tmp_path)
    assert {p.name for p in written} == {
        "shared.py",
        "models.py",
        "endpoint_configs.py",
        "endpoints.py",
        "optimization_jobs.py",
        "tags.py",
        "operations.py",
        "tagging.py",
        "cloudwatch.py",
    }
    for path in written:
        assert path.read_bytes() == (SHAPES_DIR / path.name).read_bytes(), (
            f"{path.name} is stale: run python -m eaglenest.foundation.shapes._codegen"
        )
        assert path.read_text().startswith("# Generated by `python -m eaglenest.foundation.shapes._codegen`")
    assert _codegen.render() == _codegen.render()
    assert _codegen.stale(SHAPES_DIR) == []


def test_codegen_aliases_clashing_member_names() -> None:
    fake = ServiceModel(
        {
            "metadata": {"protocol": "json", "apiVersion": "2017-01-01"},
            "operations": {},
            "shapes": {
                "Thing": {
                    "type": "structure",
                    "required": ["Schema"],
                    "members": {"Schema": {"shape": "Str"}, "copy": {"shape": "Str"}},
                },
                "Str": {"type": "string", "max": 3},
            },
        }
    )
    source = _codegen.class_source(fake.shape_for("Thing"))
    assert 'Schema_: T_Str = Field(alias="Schema")' in source
    assert 'copy_: T_Str | None = Field(default=None, alias="copy")' in source
    namespace: dict[str, Any] = {"AwsShape": AwsShape, "Field": Field, "T_Str": str}
    # dont_inherit: this file's `from __future__ import annotations` must not leak in
    exec(compile(source, "<generated>", "exec", dont_inherit=True), namespace)
    thing = namespace["Thing"].model_validate({"Schema": "a", "copy": "b"})
    assert thing.model_dump() == {"Schema": "a", "copy": "b"}
    with pytest.raises(ValueError):
        namespace["Thing"].model_validate({"Schema_": "a"})


# --------------------------------------------------------------------------- patterns


def test_patterns_are_anchored_and_keep_the_original() -> None:
    anchored = aws_pattern("[a-z]+")
    assert ORIGINAL_PATTERNS[anchored] == "[a-z]+"
    assert re.match(anchored, "abc")
    for bad in ("abc\n", "abc-", "-abc", "ab c", ""):
        assert re.match(anchored, bad) is None, bad


def test_java_semantics() -> None:
    digits = re.compile(java_to_python(r"\d{3}"))
    assert digits.match("123") and not digits.match("١٢٣")  # Java \d is ASCII
    dot = re.compile(java_to_python(".*"))
    assert dot.match("a b") and not dot.match("a\rb") and not dot.match("a\n")
    not_blank = re.compile(java_to_python(r"(?!\s*$).+"))
    assert not_blank.match("x") and not not_blank.match("   ") and not not_blank.match("")
    with pytest.raises(NotImplementedError):
        java_to_python(r"\p{L}+")
    with pytest.raises(NotImplementedError):
        java_to_python(r"[\p{Lu}]")


def test_unicode_tag_pattern_matches_java_categories() -> None:
    translated = java_to_python(r"([\p{L}\p{Z}\p{N}_.:/=+\-@]*)")
    body = translated[translated.index("[") : translated.rindex("]") + 1]
    everything = "".join(chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF)
    matched = set(re.findall(body, everything))
    expected = {c for c in everything if unicodedata.category(c)[0] in "LNZ" or c in "_.:/=+-@"}
    assert matched == expected


# --------------------------------------------------------------------------- messages

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
JOB_BASE: dict[str, Any] = {
    "OptimizationJobName": "eagle-job",
    "RoleArn": ROLE,
    "ModelSource": {"S3": {"S3Uri": "s3://bucket/model/"}},
    "DeploymentInstanceType": "ml.g5.xlarge",
    "OutputConfig": {"S3OutputLocation": "s3://bucket/out/"},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
}
EAGLE = {"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}


def error_of(op: str, body: Any) -> tuple[str, str]:
    with pytest.raises((ValidationException, SerializationException)) as info:
        shapes.parse_input(op, body)
    return info.value.code, info.value.message


def one(value: str, path: str, constraint: str) -> str:
    return (
        f"1 validation error detected: Value '{value}' at '{path}' "
        f"failed to satisfy constraint: {constraint}"
    )


def test_pattern_message() -> None:
    assert error_of("CreateModel", {"ModelName": "bad_name!"}) == (
        "ValidationException",
        "1 validation error detected: Value 'bad_name!' at 'modelName' failed to satisfy "
        "constraint: Member must satisfy regular expression pattern: "
        r"[a-zA-Z0-9]([\-a-zA-Z0-9]*[a-zA-Z0-9])?",
    )


def test_trailing_newline_fails_the_pattern() -> None:
    code, message = error_of("DescribeModel", {"ModelName": "abc\n"})
    assert code == "ValidationException" and "regular expression pattern" in message


def test_max_length_message() -> None:
    name = "a" * 64
    assert error_of("CreateModel", {"ModelName": name}) == (
        "ValidationException",
        one(name, "modelName", "Member must have length less than or equal to 63"),
    )


def test_min_length_and_pattern_are_both_reported() -> None:
    body = {**JOB_BASE, "OptimizationJobName": "", "OptimizationConfigs": [EAGLE]}
    assert error_of("CreateOptimizationJob", body)[1] == (
        "2 validation errors detected: "
        "Value '' at 'optimizationJobName' failed to satisfy constraint: Member must satisfy "
        "regular expression pattern: [a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}; "
        "Value '' at 'optimizationJobName' failed to satisfy constraint: Member must have "
        "length greater than or equal to 1"
    )


def test_optional_member_reports_pattern_and_length() -> None:
    value = "!" * 64
    assert error_of("ListModels", {"NameContains": value})[1] == (
        "2 validation errors detected: "
        f"Value '{value}' at 'nameContains' failed to satisfy constraint: Member must satisfy "
        "regular expression pattern: [a-zA-Z0-9-]+; "
        f"Value '{value}' at 'nameContains' failed to satisfy constraint: Member must have "
        "length less than or equal to 63"
    )


def test_enum_message_nested_in_list_and_union() -> None:
    medusa = {"ModelSpeculativeDecodingConfig": {"Technique": "MEDUSA"}}
    body = {**JOB_BASE, "OptimizationConfigs": [medusa]}
    assert error_of("CreateOptimizationJob", body) == (
        "ValidationException",
        one(
            "MEDUSA",
            "optimizationConfigs.1.member.modelSpeculativeDecodingConfig.technique",
            "Member must satisfy enum value set: [EAGLE]",
        ),
    )


def test_enum_message_lists_values_comma_separated() -> None:
    assert error_of("ListModels", {"SortBy": "Size"})[1] == one(
        "Size", "sortBy", "Member must satisfy enum value set: [Name, CreationTime]"
    )


def test_max_value_message() -> None:
    assert error_of("ListModels", {"MaxResults": 1000}) == (
        "ValidationException",
        one("1000", "maxResults", "Member must have value less than or equal to 100"),
    )


def test_min_value_message() -> None:
    assert error_of("ListEndpoints", {"MaxResults": 0})[1] == one(
        "0", "maxResults", "Member must have value greater than or equal to 1"
    )


def test_list_too_long_message() -> None:
    configs = [EAGLE] * 11
    body = {**JOB_BASE, "OptimizationConfigs": configs}
    shown = json.dumps(configs, separators=(",", ":"))[:253] + "..."
    assert error_of("CreateOptimizationJob", body) == (
        "ValidationException",
        one(shown, "optimizationConfigs", "Member must have length less than or equal to 10"),
    )


def test_short_list_value_is_compact_json() -> None:
    vpc = {"SecurityGroupIds": ["sg-1"] * 6, "Subnets": ["subnet-1"]}
    assert error_of("CreateModel", {"ModelName": "m", "VpcConfig": vpc})[1] == one(
        '["sg-1","sg-1","sg-1","sg-1","sg-1","sg-1"]',
        "vpcConfig.securityGroupIds",
        "Member must have length less than or equal to 5",
    )


def test_missing_required_message() -> None:
    assert error_of("CreateModel", {}) == (
        "ValidationException",
        "1 validation error detected: Value null at 'modelName' failed to satisfy "
        "constraint: Member must not be null",
    )


def test_explicit_null_for_required_member() -> None:
    body = {"ModelName": "m", "Tags": [{"Key": "team", "Value": None}]}
    assert error_of("CreateModel", body)[1] == (
        "1 validation error detected: Value null at 'tags.1.member.value' failed to satisfy "
        "constraint: Member must not be null"
    )


def test_unknown_members_are_ignored() -> None:
    """A newer botocore's members are dropped, top-level and nested; the rest is parsed."""
    parsed = shapes.parse_input("DescribeModel", {"ModelName": "m", "Foo": "bar"})
    assert parsed.model_dump(exclude_none=True) == {"ModelName": "m"}
    body = {"ModelName": "m", "ExecutionRoleArn": ROLE,
            "PrimaryContainer": {"Image": "img", "Imag": 3}}
    parsed = shapes.parse_input("CreateModel", body)
    assert parsed.model_dump(exclude_none=True, by_alias=True)["PrimaryContainer"] == {
        "Image": "img"}
    assert body["PrimaryContainer"] == {"Image": "img", "Imag": 3}  # the caller's dict as sent


def test_unknown_member_beside_an_invalid_one_reports_only_the_known() -> None:
    body = {"ModelName": "m", "PrimaryContainer": {"Image": "has space", "Imag": 3}}
    assert error_of("CreateModel", body) == (
        "ValidationException",
        one("has space", "primaryContainer.image",
            "Member must satisfy regular expression pattern: [\\S]+"))


@pytest.mark.parametrize(
    ("op", "body", "message"),
    [
        (
            "ListModels",
            {"MaxResults": "10"},
            "Invalid type at 'maxResults': expected integer, got string",
        ),
        (
            "ListModels",
            {"MaxResults": 1.5},
            "Invalid type at 'maxResults': expected integer, got number",
        ),
        (
            "ListModels",
            {"MaxResults": True},
            "Invalid type at 'maxResults': expected integer, got boolean",
        ),
        (
            "CreateModel",
            {"ModelName": "m", "PrimaryContainer": "img"},
            "Invalid type at 'primaryContainer': expected structure, got string",
        ),
        (
            "CreateModel",
            {"ModelName": "m", "EnableNetworkIsolation": "true"},
            "Invalid type at 'enableNetworkIsolation': expected boolean, got string",
        ),
        (
            "CreateModel",
            {"ModelName": 7},
            "Invalid type at 'modelName': expected string, got number",
        ),
        (
            "CreateModel",
            {"ModelName": "m", "Tags": {"Key": "k"}},
            "Invalid type at 'tags': expected list, got object",
        ),
        (
            "CreateModel",
            {"ModelName": "m", "PrimaryContainer": {"Environment": {"K": 1}}},
            "Invalid type at 'primaryContainer.environment.K': expected string, got number",
        ),
        (
            "CreateOptimizationJob",
            {**JOB_BASE, "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": []}]},
            "Invalid type at 'optimizationConfigs.1.member.modelSpeculativeDecodingConfig': "
            "expected structure, got array",
        ),
        (
            "ListModels",
            {"CreationTimeBefore": "yesterday"},
            "Invalid type at 'creationTimeBefore': expected timestamp, got string",
        ),
        (
            "ListModels",
            {"SortBy": 3},
            "Invalid type at 'sortBy': expected string, got number",
        ),
    ],
)
def test_wrong_type_is_a_serialization_exception(op: str, body: Any, message: str) -> None:
    assert error_of(op, body) == ("SerializationException", message)


def test_wrong_type_wins_over_constraints() -> None:
    code, _ = error_of("ListModels", {"MaxResults": 1000, "SortBy": 1})
    assert code == "SerializationException"


def test_body_must_be_an_object() -> None:
    assert error_of("ListModels", [1]) == (
        "SerializationException",
        "Invalid type for the request body: expected structure, got array",
    )


def test_union_with_two_members_message() -> None:
    both = {"ModelQuantizationConfig": {}, **EAGLE}
    body = {**JOB_BASE, "OptimizationConfigs": [both]}
    assert error_of("CreateOptimizationJob", body) == (
        "ValidationException",
        one(
            '{"ModelQuantizationConfig":{},"ModelSpeculativeDecodingConfig":{"Technique":"EAGLE"}}',
            "optimizationConfigs.1.member",
            "Member must have exactly one member set, but 2 are set: "
            "[modelQuantizationConfig, modelSpeculativeDecodingConfig]",
        ),
    )


def test_union_with_no_member_message() -> None:
    body = {**JOB_BASE, "OptimizationConfigs": [EAGLE, {}]}
    assert error_of("CreateOptimizationJob", body)[1] == one(
        "{}",
        "optimizationConfigs.2.member",
        "Member must have exactly one member set: none of [modelQuantizationConfig, "
        "modelCompilationConfig, modelShardingConfig, modelSpeculativeDecodingConfig] is set",
    )


def test_two_errors_at_once() -> None:
    tags = [{"Key": "", "Value": "v"}]
    body = {"EndpointName": "bad_name", "EndpointConfigName": "cfg", "Tags": tags}
    assert error_of("CreateEndpoint", body) == (
        "ValidationException",
        "2 validation errors detected: "
        "Value 'bad_name' at 'endpointName' failed to satisfy constraint: Member must "
        "satisfy regular expression pattern: [a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}; "
        "Value '' at 'tags.1.member.key' failed to satisfy constraint: Member must have "
        "length greater than or equal to 1",
    )


def test_too_long_name_also_breaks_its_pattern() -> None:
    # [a-zA-Z0-9](-*[a-zA-Z0-9]){0,62} allows at most 63 characters: AWS reports both
    name = "c" * 64
    assert error_of("DescribeEndpointConfig", {"EndpointConfigName": name})[1] == (
        "2 validation errors detected: "
        f"Value '{name}' at 'endpointConfigName' failed to satisfy constraint: Member must "
        "satisfy regular expression pattern: [a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}; "
        f"Value '{name}' at 'endpointConfigName' failed to satisfy constraint: Member must "
        "have length less than or equal to 63"
    )


def test_map_key_and_value_messages() -> None:
    env = {"bad key": "v", "OK": "x" * 1025}
    body = {"ModelName": "m", "PrimaryContainer": {"Environment": env}}
    assert error_of("CreateModel", body)[1] == (
        "2 validation errors detected: "
        "Value 'bad key' at 'primaryContainer.environment' failed to satisfy constraint: "
        "Map keys must satisfy constraint: [Member must satisfy regular expression pattern: "
        "[a-zA-Z_][a-zA-Z0-9_]*]; "
        f"Value '{'x' * 253}...' at 'primaryContainer.environment.OK' failed to satisfy "
        "constraint: Member must have length less than or equal to 1024"
    )


def test_messages_leak_no_pydantic_internals() -> None:
    bodies = [
        {},
        {"ModelName": ["x"]},
        {"ModelName": "m", "PrimaryContainer": {"Mode": "Nope", "Environment": {"": None}}},
        {"ModelName": "m", "Containers": [None, {"Image": 1}]},
    ]
    for body in bodies:
        _, message = error_of("CreateModel", body)
        for leak in ("pydantic", "Input should", "Traceback", "type=", "[key]"):
            assert leak not in message


def test_unknown_operation() -> None:
    with pytest.raises(UnknownOperationException):
        shapes.parse_input("CreateTrainingJob", {})


# --------------------------------------------------------------------------- timestamps


@pytest.mark.parametrize(
    "value",
    [
        1735689600,
        1735689600.0,
        "2025-01-01T00:00:00Z",
        "2025-01-01T01:00:00+01:00",
        "2025-01-01T00:00:00",
    ],
)
def test_timestamps_become_aware_utc(value: Any) -> None:
    parsed = shapes.parse_input("ListModels", {"CreationTimeAfter": value})
    assert parsed.CreationTimeAfter == datetime(2025, 1, 1, tzinfo=UTC)  # type: ignore[attr-defined]
    assert parsed.CreationTimeAfter.tzinfo is UTC  # type: ignore[attr-defined]


def test_timestamp_dumps_as_epoch_float() -> None:
    class Stamp(AwsShape):
        At: AwsTimestamp

    stamp = Stamp.model_validate({"At": 1735689600.123})
    assert stamp.model_dump(mode="json") == {"At": 1735689600.123}
    assert stamp.model_dump()["At"] == datetime.fromtimestamp(1735689600.123, tz=UTC)


# --------------------------------------------------------------------------- dump_output


def test_dump_output_drops_none_and_writes_epoch_floats() -> None:
    data = {
        "ModelName": "m",
        "PrimaryContainer": None,
        "CreationTime": datetime(2025, 1, 1, 0, 0, 0, 123000, tzinfo=UTC),
        "ModelArn": "arn:aws:sagemaker:us-east-1:123456789012:model/m",
    }
    out = shapes.dump_output("DescribeModel", data)
    assert out == {
        "ModelName": "m",
        "CreationTime": 1735689600.123,
        "ModelArn": "arn:aws:sagemaker:us-east-1:123456789012:model/m",
    }
    assert isinstance(out["CreationTime"], float)
    assert json.loads(json.dumps(out)) == out


def test_dump_output_without_output_shape() -> None:
    assert shapes.dump_output("DeleteModel", {}) == {}


def test_dump_output_rejects_a_bad_response() -> None:
    with pytest.raises(InternalFailure) as info:
        shapes.dump_output("DescribeModel", {"ModelName": "m", "Extra": 1})
    assert info.value.status == 400  # never 5xx: boto3 would retry a deterministic bug
    assert "creationTime" in info.value.message and "Extra" in info.value.message


# --------------------------------------------------------------------------- round trips

CREATE_ENDPOINT_CONFIG: dict[str, Any] = {
    "EndpointConfigName": "eagle-config",
    "ProductionVariants": [
        {
            "VariantName": "AllTraffic",
            "ModelName": "llama-eagle",
            "InitialInstanceCount": 1,
            "InstanceType": "ml.g5.2xlarge",
            "InitialVariantWeight": 1.0,
            "VolumeSizeInGB": 100,
            "ModelDataDownloadTimeoutInSeconds": 1800,
            "ContainerStartupHealthCheckTimeoutInSeconds": 600,
            "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"},
            "ManagedInstanceScaling": {
                "Status": "ENABLED",
                "MinInstanceCount": 1,
                "MaxInstanceCount": 2,
            },
        }
    ],
    "DataCaptureConfig": {
        "EnableCapture": True,
        "InitialSamplingPercentage": 100,
        "DestinationS3Uri": "s3://bucket/capture",
        "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
        "CaptureContentTypeHeader": {"JsonContentTypes": ["application/json"]},
    },
    "Tags": [{"Key": "project", "Value": "eagle nest"}],
    "KmsKeyId": "alias/my-key",
    "AsyncInferenceConfig": {
        "ClientConfig": {"MaxConcurrentInvocationsPerInstance": 4},
        "OutputConfig": {
            "S3OutputPath": "s3://bucket/async",
            "NotificationConfig": {
                "SuccessTopic": "arn:aws:sns:us-east-1:123456789012:ok",
                "IncludeInferenceResponseIn": ["SUCCESS_NOTIFICATION_TOPIC"],
            },
        },
    },
    "ExecutionRoleArn": ROLE,
    "VpcConfig": {"SecurityGroupIds": ["sg-0123"], "Subnets": ["subnet-0123"]},
    "EnableNetworkIsolation": False,
}

CREATE_OPTIMIZATION_JOB: dict[str, Any] = {
    "OptimizationJobName": "llama-eagle3",
    "RoleArn": ROLE,
    "ModelSource": {
        "S3": {
            "S3Uri": "s3://bucket/models/llama/",
            "ModelAccessConfig": {"AcceptEula": True},
        }
    },
    "DeploymentInstanceType": "ml.g6e.xlarge",
    "MaxInstanceCount": 1,
    "OptimizationEnvironment": {"EAGLE_VERSION": "3", "NUM_SPECULATIVE_TOKENS": "5"},
    "OptimizationConfigs": [
        {
            "ModelSpeculativeDecodingConfig": {
                "Technique": "EAGLE",
                "TrainingDataSource": {
                    "S3Uri": "s3://bucket/data/sharegpt.jsonl",
                    "S3DataType": "S3Prefix",
                },
            }
        }
    ],
    "OutputConfig": {
        "S3OutputLocation": "s3://bucket/output/",
        "KmsKeyId": "alias/my-key",
        "SageMakerModel": {"ModelName": "llama-eagle"},
    },
    "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
    "Tags": [{"Key": "team", "Value": "inference"}],
    "VpcConfig": {"SecurityGroupIds": ["sg-1"], "Subnets": ["subnet-1"]},
}


@pytest.mark.parametrize(
    ("op", "body"),
    [
        ("CreateEndpointConfig", CREATE_ENDPOINT_CONFIG),
        ("CreateOptimizationJob", CREATE_OPTIMIZATION_JOB),
    ],
)
def test_full_request_round_trips(op: str, body: dict[str, Any]) -> None:
    parsed = shapes.parse_input(op, body)
    assert type(parsed).__name__ == SAGEMAKER.operation_model(op).input_shape.name
    assert parsed.model_dump(exclude_none=True) == body


# One valid sample per botocore pattern (every pattern in the closure must be listed).
PATTERN_SAMPLES = {
    r"[a-zA-Z0-9]([\-a-zA-Z0-9]*[a-zA-Z0-9])?": "my-model",
    r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}": "name-1",
    r"[\S]+": "123456789012.dkr.ecr.us-east-1.amazonaws.com/eagle:latest",
    r".*": "token-1",
    r"(https|s3)://([^/]+)/?(.*)": "s3://bucket/prefix/",
    r"[A-Za-z0-9\.\-_]+": "eagle_model",
    r"[a-zA-Z_][a-zA-Z0-9_]*": "HF_TASK",
    r"[\S\s]*": "text-generation",
    r"(arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:[a-z\-]*\/)?([a-zA-Z0-9]([a-zA-Z0-9-])"
    r"{0,62})(?<!-)(\/[0-9]{1,9})?": "my-package/1",
    r"arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+": ROLE,
    r"([\p{L}\p{Z}\p{N}_.:/=+\-@]*)": "Équipe 1",
    r"[-0-9a-zA-Z]+": "sg-0123",
    r"arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:model/.*": "arn:aws:sagemaker:us-east-1:123456789012:model/m",
    r"[a-zA-Z0-9-]+": "llama",
    r"(https|s3)://([^/])/?(.*)": "s3://bucket/capture",
    r"[a-zA-Z0-9:/_-]*": "alias/my-key",
    r"arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:[a-z0-9\-]{1,14}/.*": "arn:aws:sagemaker:us-east-1:123456789012:ml-reservation/r1",
    r"[a-zA-Z0-9](-*[a-zA-Z0-9])*\/[a-zA-Z0-9](-*[a-zA-Z0-9.])*": "application/json",
    r"arn:aws[a-z\-]*:sns:[a-z0-9\-]*:[0-9]{12}:[a-zA-Z0-9_.-]+": "arn:aws:sns:us-east-1:123456789012:topic",
    r"[a-zA-Z0-9](-*[a-zA-Z0-9])*\/[a-zA-Z0-9](-*[a-zA-Z0-9+.])*": "text/plain",
    r"[\s\S]+": "1,2,3",
    r"arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:endpoint-config/.*": "arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/c",
    r"(?!\s*$).+": "HighLatency",
    r"arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:endpoint/.*": "arn:aws:sagemaker:us-east-1:123456789012:endpoint/e",
    r"arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:optimization-job/.*": "arn:aws:sagemaker:us-east-1:123456789012:optimization-job/j",
    r"[a-zA-Z0-9\-]+": "job",
    r"arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:training-plan/.*": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p",
    r"mig-[0-9]+g\.[0-9]+gb([+-][a-z0-9.]+)*": "mig-1g.10gb",
    r"/(?!.*\.\.)[a-zA-Z0-9/_.\-]+": "/metrics",
    r"arn:aws[a-z-]*:sagemaker:[a-z0-9-]*:[0-9]{12}:.+": "arn:aws:sagemaker:us-east-1:123456789012:model/m",
}


def example(shape: Shape) -> Any:
    """A value for ``shape`` that sets every member (unions: their first member)."""
    meta, kind = shape.metadata, shape.type_name
    if kind == "structure":
        members = list(shape.members.items())[:1] if meta.get("union") else shape.members.items()
        return {name: example(member) for name, member in members}
    if kind == "list":
        return [example(shape.member)] * max(1, meta.get("min", 1))
    if kind == "map":
        return {example(shape.key): example(shape.value)}
    if kind == "string":
        if "enum" in meta:
            return meta["enum"][-1]
        return PATTERN_SAMPLES[meta["pattern"]] if "pattern" in meta else "some text"
    if kind in ("integer", "long"):
        return meta.get("min", 1)
    if kind in ("float", "double"):
        return float(meta.get("min", 0.5))
    if kind == "boolean":
        return True
    assert kind == "timestamp"
    return 1735689600.5


def test_every_pattern_has_a_sample() -> None:
    patterns = {s.metadata["pattern"] for s in CLOSURE.values() if "pattern" in s.metadata}
    assert patterns == set(PATTERN_SAMPLES)


@pytest.mark.parametrize("op", OPERATIONS)
def test_every_member_round_trips(op: str) -> None:
    op_model = SAGEMAKER.operation_model(op)
    body = example(op_model.input_shape)
    parsed = shapes.parse_input(op, body)
    assert parsed.model_dump(mode="json", exclude_none=True) == body
    if op_model.output_shape is not None:
        data = example(op_model.output_shape)
        assert shapes.dump_output(op, data) == data
