"""Endpoint configs through boto3: variants' models must exist, validation, not-found."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"


@pytest.fixture
def model(sm, unique):
    sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE, PrimaryContainer={"Image": "lmi"})
    return unique


def variant(model: str, name: str = "AllTraffic", **kw: object) -> dict[str, object]:
    return {"VariantName": name, "ModelName": model, "InstanceType": "ml.g5.2xlarge",
            "InitialInstanceCount": 1, "InitialVariantWeight": 1.0, **kw}


def test_round_trip_with_data_capture(sm, model):
    capture = {"EnableCapture": True, "InitialSamplingPercentage": 100,
               "DestinationS3Uri": "s3://bucket/capture",
               "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}]}
    arn = sm.create_endpoint_config(
        EndpointConfigName=model, DataCaptureConfig=capture,
        ProductionVariants=[variant(model, ContainerStartupHealthCheckTimeoutInSeconds=600)],
    )["EndpointConfigArn"]
    assert arn == f"arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/{model.lower()}"
    d = sm.describe_endpoint_config(EndpointConfigName=model)
    assert d["ProductionVariants"] == [variant(model, ContainerStartupHealthCheckTimeoutInSeconds=600)]
    assert d["DataCaptureConfig"] == capture
    sm.delete_endpoint_config(EndpointConfigName=model)
    with pytest.raises(ClientError) as exc:
        sm.describe_endpoint_config(EndpointConfigName=model)
    assert exc.value.response["Error"]["Code"] == "ValidationException"
    assert exc.value.response["Error"]["Message"] == (
        'Could not find endpoint configuration "arn:aws:sagemaker:us-east-1:123456789012:'
        f'endpoint-config/{model.lower()}".'
    )


def test_variant_model_must_exist(sm, unique):
    with pytest.raises(ClientError) as exc:
        sm.create_endpoint_config(EndpointConfigName=unique,
                                  ProductionVariants=[variant("missing-model")])
    assert exc.value.response["Error"]["Code"] == "ValidationException"
    assert exc.value.response["Error"]["Message"] == (
        'Could not find model "arn:aws:sagemaker:us-east-1:123456789012:model/missing-model".'
    )
    with pytest.raises(ClientError):
        sm.describe_endpoint_config(EndpointConfigName=unique)


def test_too_many_variants(sm, model, unique):
    variants = [variant(model, f"v{i}") for i in range(11)]
    with pytest.raises(ClientError) as exc:
        sm.create_endpoint_config(EndpointConfigName=unique, ProductionVariants=variants)
    assert exc.value.response["Error"]["Code"] == "ValidationException"
    assert "at 'productionVariants' failed to satisfy constraint: Member must have length " \
           "less than or equal to 10" in exc.value.response["Error"]["Message"]


def test_duplicate_variant_names_and_duplicate_config(sm, model, unique):
    with pytest.raises(ClientError) as exc:
        sm.create_endpoint_config(EndpointConfigName=unique,
                                  ProductionVariants=[variant(model, "a"), variant(model, "a")])
    assert "Variant names must be unique" in exc.value.response["Error"]["Message"]
    sm.create_endpoint_config(EndpointConfigName=unique, ProductionVariants=[variant(model)])
    with pytest.raises(ClientError) as exc:
        sm.create_endpoint_config(EndpointConfigName=unique, ProductionVariants=[variant(model)])
    assert exc.value.response["Error"]["Code"] == "ValidationException"
    assert exc.value.response["Error"]["Message"].startswith(
        "Cannot create already existing endpoint configuration")


def test_variant_needs_instance_type_or_serverless(sm, model, unique):
    v = {"VariantName": "v", "ModelName": model}
    with pytest.raises(ClientError) as exc:
        sm.create_endpoint_config(EndpointConfigName=unique, ProductionVariants=[v])
    assert "InstanceType or ServerlessConfig" in exc.value.response["Error"]["Message"]


def test_bad_instance_type_enum(sm, model, unique):
    with pytest.raises(ClientError) as exc:
        sm.create_endpoint_config(EndpointConfigName=unique, ProductionVariants=[
            variant(model, InstanceType="ml.bogus.type")])
    msg = exc.value.response["Error"]["Message"]
    assert "Value 'ml.bogus.type' at 'productionVariants.1.member.instanceType'" in msg
    assert "Member must satisfy enum value set:" in msg


def test_instance_count_is_capped_per_variant(sm, model, unique):
    """Each instance is a whole model server on the serving host: at most
    EAGLENEST_MAX_INSTANCES_PER_VARIANT (default 4) per variant; botocore only checks >= 1."""
    with pytest.raises(ClientError) as exc:
        sm.create_endpoint_config(EndpointConfigName=unique, ProductionVariants=[
            variant(model, "a"), variant(model, "b", InitialInstanceCount=5)])
    assert exc.value.response["Error"]["Code"] == "ResourceLimitExceeded"
    assert exc.value.response["Error"]["Message"] == (
        "ProductionVariants.2.InitialInstanceCount is 5, but this service runs at most 4 "
        "instances (model server processes) per variant (EAGLENEST_MAX_INSTANCES_PER_VARIANT).")
    with pytest.raises(ClientError):
        sm.describe_endpoint_config(EndpointConfigName=unique)  # nothing was created
    sm.create_endpoint_config(EndpointConfigName=unique, ProductionVariants=[
        variant(model, InitialInstanceCount=4)])
    assert sm.describe_endpoint_config(EndpointConfigName=unique)[
        "ProductionVariants"][0]["InitialInstanceCount"] == 4
