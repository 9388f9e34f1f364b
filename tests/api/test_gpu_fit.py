"""Create-time GPU fit (issue #50, db/gpu_fit.py) through boto3 against the real stack: a
model that cannot fit its instance type's GPUs, or a container option that cannot be read,
is refused by CreateEndpoint / UpdateEndpoint / CreateOptimizationJob with a
ValidationException naming the sizes or the variable, and nothing is created.

The model folders hold config.json and the safetensors index only (no weights): the plan
reads nothing else. No worker runs here: an accepted endpoint stays Creating.
"""

from __future__ import annotations

import json
import time
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from eaglenest.db import endpoints_repo
from eaglenest.db.session import Database
from tests.api.test_aws_cli import aws
from tests.support.stack import ACCESS_KEY, REGION, SECRET_KEY, Stack

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "vocab_size": 128256, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
QWEN_14B = {
    "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 48, "hidden_size": 5120,
    "num_attention_heads": 40, "num_key_value_heads": 8, "intermediate_size": 13824,
    "vocab_size": 152064, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}
LLAMA_70B = {**LLAMA_8B, "num_hidden_layers": 80, "hidden_size": 8192,
             "num_attention_heads": 64, "intermediate_size": 28672}
MODELS = {"llama-8b": (LLAMA_8B, 16060522496), "qwen-14b": (QWEN_14B, 29540067328),
          "llama-70b": (LLAMA_70B, 141107412992)}


def s3_client(stack: Stack) -> Any:
    return boto3.client("s3", endpoint_url=stack.url, region_name=REGION,
                        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                        config=Config(s3={"addressing_style": "path"},
                                      retries={"total_max_attempts": 1}))


@pytest.fixture(scope="module")
def bucket(stack: Stack) -> str:
    """A bucket of the caller's account holding the three model folders (shapes only: the
    index's weight_map names shards that do not exist)."""
    name = f"gpu-fit-{int(time.time() * 1000) % 10**8}"
    s3 = s3_client(stack)
    s3.create_bucket(Bucket=name)
    for folder, (config, total) in MODELS.items():
        index = {"metadata": {"total_size": total}, "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors"}}
        s3.put_object(Bucket=name, Key=f"{folder}/config.json", Body=json.dumps(config))
        s3.put_object(Bucket=name, Key=f"{folder}/model.safetensors.index.json",
                      Body=json.dumps(index))
    return name


def err(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, str]:
    return exc.value.response["Error"]["Code"], exc.value.response["Error"]["Message"]


def model_and_config(sm: Any, name: str, uri: str, instance_type: str,
                     env: dict[str, str] | None = None, **container: Any) -> None:
    """CreateModel (the folder at `uri`) and CreateEndpointConfig of one variant: neither
    plans anything."""
    source = {"ModelDataSource": {"S3DataSource": {
        "S3Uri": uri, "S3DataType": "S3Prefix", "CompressionType": "None"}}}
    sm.create_model(ModelName=name, ExecutionRoleArn=ROLE, PrimaryContainer={
        "Image": "lmi", "Environment": env or {}, **(container or source)})
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": name, "InstanceType": instance_type,
        "InitialInstanceCount": 1}])


def refused(sm: Any, name: str) -> str:
    """CreateEndpoint `name` on its config: the ValidationException's message, after
    checking that no endpoint was created."""
    with pytest.raises(ClientError) as exc:
        sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    code, message = err(exc)
    assert code == "ValidationException", message
    with pytest.raises(ClientError) as gone:
        sm.describe_endpoint(EndpointName=name)
    assert err(gone)[1].startswith("Could not find endpoint")
    return message


def accepted(sm: Any, name: str) -> None:
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    assert sm.describe_endpoint(EndpointName=name)["EndpointStatus"] == "Creating"
    sm.delete_endpoint(EndpointName=name)


def test_a_model_too_big_for_its_gpu_is_refused_naming_the_sizes(sm, bucket, unique):
    model_and_config(sm, unique, f"s3://{bucket}/qwen-14b/", "ml.g5.xlarge")
    message = refused(sm, unique)
    assert message.startswith("Variant 'AllTraffic': the model does not fit ml.g5.xlarge "
                              "(1 x A10G 24 GiB): Qwen2ForCausalLM, 14.77B parameters"), message
    assert "27.5 GiB of weights" in message
    assert "GiB of KV cache for 2048 tokens" in message
    assert "each GPU gives 19.4 GiB (0.9 of 21.6 GiB)" in message


def test_a_model_that_fits_all_the_gpus_of_its_type_is_accepted(sm, bucket, unique):
    model_and_config(sm, unique, f"s3://{bucket}/llama-70b/", "ml.p4d.24xlarge")
    accepted(sm, unique)


def test_dtype_spellings(sm, bucket, unique):
    model_and_config(sm, f"{unique}-fp16", f"s3://{bucket}/llama-8b/", "ml.g5.2xlarge",
                     {"OPTION_DTYPE": "fp16"})
    accepted(sm, f"{unique}-fp16")
    with pytest.raises(ClientError) as exc:  # CreateModel reads the options (issue #51)
        model_and_config(sm, unique, f"s3://{bucket}/llama-8b/", "ml.g5.2xlarge",
                         {"OPTION_DTYPE": "int3"})
    assert err(exc) == ("ValidationException", (
        "PrimaryContainer.Environment: OPTION_DTYPE='int3' is not a dtype EagleNest accepts; "
        "use one of fp16, float16, half, bf16, bfloat16, fp32, float32, float, auto"))


def test_a_tensor_parallel_degree_that_does_not_divide_the_heads_is_refused(sm, bucket,
                                                                           unique):
    model_and_config(sm, unique, f"s3://{bucket}/llama-8b/", "ml.g5.12xlarge",
                     {"OPTION_TENSOR_PARALLEL_DEGREE": "3"})
    message = refused(sm, unique)
    assert message.startswith("Variant 'AllTraffic': OPTION_TENSOR_PARALLEL_DEGREE=3 does not "
                              "divide the model's attention heads"), message
    assert "32 attention heads and 8 KV heads" in message
    assert message.endswith("degrees that work on 4 GPU(s): 1, 2, 4")


@pytest.mark.parametrize(("model", "itype", "env", "expected"), [
    ("llama-8b", "ml.g5.2xlarge", {"SM_NUM_GPUS": "2"},
     "SM_NUM_GPUS=2 asks for more GPUs than the instance holds (1)"),
    ("qwen-14b", "ml.g5.2xlarge", {"OPTION_MAX_MODEL_LEN": "65536"},
     "OPTION_MAX_MODEL_LEN=65536 is more than the model's own maximum, 32768 tokens "
     "(config.json)"),
], ids=["tp-over-gpus", "length-over-the-model"])
def test_bad_options_are_refused_naming_the_variable(sm, bucket, unique, model, itype, env,
                                                     expected):
    model_and_config(sm, unique, f"s3://{bucket}/{model}/", itype, env)
    assert refused(sm, unique).startswith(f"Variant 'AllTraffic': {expected}")


@pytest.mark.parametrize("container", [
    {"ModelDataUrl": "s3://{bucket}/qwen-14b/model.tar.gz"},  # a tarball: the worker's
    {"ModelDataUrl": "s3://no-such-gpu-fit-bucket/qwen-14b/"},  # no bucket
    {"ModelDataUrl": "s3://{bucket}/not-uploaded/"},  # no config.json: the worker's message
], ids=["tarball", "missing-bucket", "missing-config"])
def test_what_create_cannot_read_is_left_to_the_worker(sm, bucket, unique, container):
    container = {k: v.format(bucket=bucket) for k, v in container.items()}
    model_and_config(sm, unique, "", "ml.g5.xlarge", **container)
    accepted(sm, unique)


def test_update_endpoint_to_a_config_that_does_not_fit_changes_nothing(sm, stack, bucket,
                                                                       unique):
    model_and_config(sm, unique, f"s3://{bucket}/llama-8b/", "ml.g5.2xlarge")
    sm.create_endpoint(EndpointName=unique, EndpointConfigName=unique)
    db = Database(stack.database_url)
    try:
        with db.session() as s:  # as a serving worker would
            endpoints_repo.mark_in_service(s, unique, {"ProductionVariants": [{
                "VariantName": "AllTraffic", "CurrentWeight": 1.0, "DesiredWeight": 1.0,
                "CurrentInstanceCount": 1, "DesiredInstanceCount": 1}]})
    finally:
        db.dispose()
    model_and_config(sm, f"{unique}-big", f"s3://{bucket}/qwen-14b/", "ml.g5.2xlarge")
    with pytest.raises(ClientError) as exc:
        sm.update_endpoint(EndpointName=unique, EndpointConfigName=f"{unique}-big")
    code, message = err(exc)
    assert code == "ValidationException"
    assert "the model does not fit ml.g5.2xlarge" in message and "27.5 GiB" in message
    d = sm.describe_endpoint(EndpointName=unique)
    assert (d["EndpointStatus"], d["EndpointConfigName"]) == ("InService", unique)
    assert "PendingDeploymentSummary" not in d
    sm.delete_endpoint(EndpointName=unique)


def job_args(bucket: str, model: str, itype: str, **env: str) -> dict[str, Any]:
    return {
        "RoleArn": ROLE, "ModelSource": {"S3": {"S3Uri": f"s3://{bucket}/{model}/"}},
        "DeploymentInstanceType": itype, "MaxInstanceCount": 1,
        "OptimizationEnvironment": env,
        "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
        "OutputConfig": {"S3OutputLocation": f"s3://{bucket}/output/"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600}}


def test_an_optimization_job_whose_benchmark_cannot_fit_is_refused(sm, bucket, unique):
    with pytest.raises(ClientError) as exc:
        sm.create_optimization_job(OptimizationJobName=unique,
                                   **job_args(bucket, "qwen-14b", "ml.g5.2xlarge"))
    code, message = err(exc)
    assert code == "ValidationException"
    assert message.startswith("DeploymentInstanceType ml.g5.2xlarge: the model does not fit "
                              "ml.g5.2xlarge (1 x A10G 24 GiB)"), message
    assert "27.5 GiB of weights" in message and "GiB for the draft head" in message
    assert "GiB of KV cache" in message
    with pytest.raises(ClientError) as gone:
        sm.describe_optimization_job(OptimizationJobName=unique)
    assert err(gone)[0] == "ResourceNotFound"


def test_optimization_job_dtype_and_fit(sm, bucket, unique):
    with pytest.raises(ClientError) as exc:
        sm.create_optimization_job(OptimizationJobName=unique, **job_args(
            bucket, "llama-8b", "ml.g5.12xlarge", EAGLENEST_DTYPE="int3"))
    assert err(exc)[0] == "ValidationException"
    assert err(exc)[1].startswith("OptimizationEnvironment: EAGLENEST_DTYPE='int3' is not a "
                                  "dtype EagleNest accepts; use one of fp16")
    sm.create_optimization_job(OptimizationJobName=unique, **job_args(
        bucket, "llama-8b", "ml.g5.12xlarge", EAGLENEST_DTYPE="bf16"))
    assert sm.describe_optimization_job(
        OptimizationJobName=unique)["OptimizationJobStatus"] == "STARTING"
    sm.delete_optimization_job(OptimizationJobName=unique)


def test_the_aws_cli_shows_the_refusal(stack, sm, bucket, unique):
    model_and_config(sm, unique, f"s3://{bucket}/qwen-14b/", "ml.g5.xlarge")
    r = aws(stack, "create-endpoint", "--endpoint-name", unique, "--endpoint-config-name",
            unique)
    assert r.returncode != 0
    assert "ValidationException" in r.stderr
    assert "the model does not fit ml.g5.xlarge" in r.stderr and "27.5 GiB" in r.stderr
