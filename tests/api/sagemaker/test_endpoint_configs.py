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


def test_list_endpoint_configs_filters_sorts_and_pages(sm, model):
    names = [f"{model}-{i}" for i in range(3)]
    for name in names:
        sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[variant(model)])
    listed = sm.list_endpoint_configs(NameContains=model, SortBy="Name",
                                      SortOrder="Ascending")["EndpointConfigs"]
    assert [c["EndpointConfigName"] for c in listed] == names
    assert listed[0]["EndpointConfigArn"].endswith(f"endpoint-config/{names[0].lower()}")
    assert all("CreationTime" in c for c in listed)
    first = sm.list_endpoint_configs(NameContains=model, SortBy="Name", SortOrder="Ascending",
                                     MaxResults=2)
    rest = sm.list_endpoint_configs(NameContains=model, SortBy="Name", SortOrder="Ascending",
                                    MaxResults=2, NextToken=first["NextToken"])
    paged = first["EndpointConfigs"] + rest["EndpointConfigs"]
    assert [c["EndpointConfigName"] for c in paged] == names and "NextToken" not in rest


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


def _refusal(sm, name: str, variants: list[dict[str, object]], **kw: object) -> str:
    """The ValidationException message of CreateEndpointConfig; nothing is created."""
    with pytest.raises(ClientError) as exc:
        sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=variants, **kw)
    assert exc.value.response["Error"]["Code"] == "ValidationException"
    with pytest.raises(ClientError):
        sm.describe_endpoint_config(EndpointConfigName=name)
    return str(exc.value.response["Error"]["Message"])


def test_refused_instance_type_names_variant_type_and_reason(sm, model, unique):
    """Inferentia, Trainium, Gaudi and K80 types pass botocore's enum but cannot run
    EagleNest's engines (foundation/instance_types.py): refused at Create, not at deploy."""
    msg = _refusal(sm, unique, [variant(model, InstanceType="ml.inf2.xlarge")])
    assert msg == (
        "Variant 'AllTraffic': ProductionVariants.1.InstanceType ml.inf2.xlarge is not "
        "supported by EagleNest: its AWS Inferentia2 chips run models only through the AWS "
        "Neuron SDK, which EagleNest's engines (vLLM on CUDA, the embedded PyTorch engine) do "
        "not use; choose a GPU type (g5, g6, g6e, p4d, p5 ...) or a CPU type (m5, c6i ...).")
    msg = _refusal(sm, unique, [variant(model)], ShadowProductionVariants=[
        variant(model, "shadow", InstanceType="ml.p2.xlarge")])
    assert msg.startswith("Variant 'shadow': ShadowProductionVariants.1.InstanceType "
                          "ml.p2.xlarge is not supported by EagleNest: its NVIDIA K80 GPUs")


def _model_with_backend(sm, name: str, backend: str | None, pipeline: bool = False) -> str:
    container: dict[str, object] = {"Image": "lmi"}
    if backend:
        container["Environment"] = {"EAGLENEST_SERVING_BACKEND": backend}
    containers = ({"Containers": [container, {"Image": "post"}]} if pipeline
                  else {"PrimaryContainer": container})
    sm.create_model(ModelName=name, ExecutionRoleArn=ROLE, **containers)
    return name


def test_embedded_backend_is_refused_several_gpus(sm, unique):
    """The embedded engine runs on one GPU: a type with several is refused for a model that
    asks for it (PrimaryContainer or an inference pipeline's first container)."""
    for pipeline in (False, True):
        embedded = _model_with_backend(sm, f"{unique}-e{int(pipeline)}", "embedded", pipeline)
        msg = _refusal(sm, unique, [variant(embedded, InstanceType="ml.g5.12xlarge")])
        assert msg == (
            "Variant 'AllTraffic': ProductionVariants.1.InstanceType ml.g5.12xlarge has 4 GPUs "
            f"(4 x A10G), but model '{embedded}' sets EAGLENEST_SERVING_BACKEND=embedded, "
            "which runs on one GPU: use EAGLENEST_SERVING_BACKEND=vllm for several GPUs, or "
            "an instance type with one.")
    for i, instance_type in enumerate(("ml.g5.2xlarge", "ml.m5.xlarge")):
        sm.create_endpoint_config(EndpointConfigName=f"{unique}-one{i}", ProductionVariants=[
            variant(embedded, InstanceType=instance_type)])


def test_several_gpus_accepted_for_vllm_or_default_backend(sm, unique):
    for backend in ("vllm", None):
        model = _model_with_backend(sm, f"{unique}-{backend}", backend)
        for instance_type in ("ml.g5.12xlarge", "ml.m5.xlarge"):
            config = f"{unique}-{backend}-{instance_type.split('.')[1]}"
            sm.create_endpoint_config(EndpointConfigName=config, ProductionVariants=[
                variant(model, InstanceType=instance_type)])
            described = sm.describe_endpoint_config(EndpointConfigName=config)
            assert described["ProductionVariants"][0]["InstanceType"] == instance_type
