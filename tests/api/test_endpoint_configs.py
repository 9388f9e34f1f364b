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


def serverless(model: str, **cfg: int) -> dict[str, object]:
    return {"VariantName": "AllTraffic", "ModelName": model,
            "ServerlessConfig": {"MemorySizeInMB": 2048, "MaxConcurrency": 10, **cfg}}


def test_serverless_config_limits(sm, model, signed_post):
    import json

    sm.create_endpoint_config(EndpointConfigName=model, ProductionVariants=[
        serverless(model, MemorySizeInMB=6144, MaxConcurrency=5, ProvisionedConcurrency=5)])
    assert sm.describe_endpoint_config(EndpointConfigName=model)["ProductionVariants"] == [
        serverless(model, MemorySizeInMB=6144, MaxConcurrency=5, ProvisionedConcurrency=5)]
    sizes = "[1024, 2048, 3072, 4096, 5120, 6144]"
    at = "productionVariants.1.member.serverlessConfig"
    with pytest.raises(ClientError) as exc:
        sm.create_endpoint_config(EndpointConfigName=model + "-b", ProductionVariants=[
            serverless(model, MemorySizeInMB=1111, MaxConcurrency=4, ProvisionedConcurrency=5)])
    assert exc.value.response["Error"]["Code"] == "ValidationException"
    assert exc.value.response["Error"]["Message"] == (
        f"2 validation errors detected: Value '1111' at '{at}.memorySizeInMB' failed to satisfy "
        f"constraint: Member must satisfy enum value set: {sizes}; Value '5' at "
        f"'{at}.provisionedConcurrency' failed to satisfy constraint: Member must have value "
        "less than or equal to MaxConcurrency (4)")
    with pytest.raises(ClientError):
        sm.describe_endpoint_config(EndpointConfigName=model + "-b")
    body = {"EndpointConfigName": model + "-c", "ProductionVariants": [
        serverless(model, MemorySizeInMB=7168, MaxConcurrency=201)]}
    r = signed_post("SageMaker.CreateEndpointConfig", json.dumps(body).encode())
    assert r.json()["__type"] == "ValidationException"
    assert "Member must have value less than or equal to 6144" in r.json()["message"]
    assert "Member must have value less than or equal to 200" in r.json()["message"]
