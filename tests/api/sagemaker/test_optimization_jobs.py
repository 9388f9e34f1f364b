"""Optimization jobs through boto3: create/describe/list/stop/delete and their errors."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"


def job_args(model: str | None = None, **override: object) -> dict[str, object]:
    source = ({"SageMakerModel": {"ModelName": model}} if model
              else {"S3": {"S3Uri": "s3://bucket/models/smollm2/"}})
    args: dict[str, object] = {
        "RoleArn": ROLE, "ModelSource": source, "DeploymentInstanceType": "ml.g5.2xlarge",
        "MaxInstanceCount": 1,
        "OptimizationEnvironment": {"EAGLENEST_HEAD": "eagle3"},
        "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {
            "Technique": "EAGLE",
            "TrainingDataSource": {"S3Uri": "s3://bucket/data/train.jsonl",
                                   "S3DataType": "S3Prefix"}}}],
        "OutputConfig": {"S3OutputLocation": "s3://bucket/output/",
                         "SageMakerModel": {"ModelName": "optimized-model"}},
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200},
        "Tags": [{"Key": "k", "Value": "v"}],
    }
    args.update(override)
    return args


def err(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, str]:
    return exc.value.response["Error"]["Code"], exc.value.response["Error"]["Message"]


def test_create_describe_round_trip(sm, unique):
    args = job_args()
    arn = sm.create_optimization_job(OptimizationJobName=unique, **args)["OptimizationJobArn"]
    assert arn == f"arn:aws:sagemaker:us-east-1:123456789012:optimization-job/{unique.lower()}"
    d = sm.describe_optimization_job(OptimizationJobName=unique)
    assert d["OptimizationJobStatus"] == "STARTING"
    for key in ("RoleArn", "ModelSource", "DeploymentInstanceType", "MaxInstanceCount",
                "OptimizationEnvironment", "OptimizationConfigs", "OutputConfig",
                "StoppingCondition"):
        assert d[key] == args[key], key
    assert "Tags" not in d
    assert d["OptimizationJobArn"] == arn
    assert "OptimizationStartTime" not in d


def test_not_found_is_resource_not_found(sm):
    for call in (sm.describe_optimization_job, sm.stop_optimization_job,
                 sm.delete_optimization_job):
        with pytest.raises(sm.exceptions.ResourceNotFound) as exc:
            call(OptimizationJobName="no-such-job")
        assert err(exc) == ("ResourceNotFound", "Optimization job no-such-job does not exist.")


def test_duplicate_is_resource_in_use(sm, unique):
    sm.create_optimization_job(OptimizationJobName=unique, **job_args())
    with pytest.raises(sm.exceptions.ResourceInUse) as exc:
        sm.create_optimization_job(OptimizationJobName=unique, **job_args())
    assert err(exc) == ("ResourceInUse", f"Optimization job {unique} already exists.")


def test_technique_must_be_eagle(sm, unique):
    args = job_args(OptimizationConfigs=[{"ModelSpeculativeDecodingConfig": {"Technique": "MEDUSA"}}])
    with pytest.raises(ClientError) as exc:
        sm.create_optimization_job(OptimizationJobName=unique, **args)
    assert err(exc) == ("ValidationException",
        "1 validation error detected: Value 'MEDUSA' at 'optimizationConfigs.1.member."
        "modelSpeculativeDecodingConfig.technique' failed to satisfy constraint: Member must "
        "satisfy enum value set: [EAGLE]")
    with pytest.raises(sm.exceptions.ResourceNotFound):
        sm.describe_optimization_job(OptimizationJobName=unique)


def test_model_source_model_must_exist(sm, unique):
    with pytest.raises(ClientError) as exc:
        sm.create_optimization_job(OptimizationJobName=unique, **job_args(model="ghost-model"))
    assert err(exc) == ("ValidationException", 'Could not find model '
                        '"arn:aws:sagemaker:us-east-1:123456789012:model/ghost-model".')
    sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE, PrimaryContainer={"Image": "lmi"})
    sm.create_optimization_job(OptimizationJobName=unique, **job_args(model=unique))


def test_model_source_must_name_something(sm, unique):
    with pytest.raises(ClientError) as exc:
        sm.create_optimization_job(OptimizationJobName=unique, **job_args(ModelSource={}))
    assert "ModelSource must specify either S3" in err(exc)[1]


def test_unsupported_optimization_kind(sm, unique):
    args = job_args(OptimizationConfigs=[{"ModelQuantizationConfig": {"Image": "x"}}])
    with pytest.raises(ClientError) as exc:
        sm.create_optimization_job(OptimizationJobName=unique, **args)
    assert err(exc)[0] == "ValidationException"
    assert "ModelQuantizationConfig is not supported" in err(exc)[1]


def test_validation_of_bad_uri_and_instance_type(sm, unique):
    args = job_args(DeploymentInstanceType="ml.bogus.type",
                    OutputConfig={"S3OutputLocation": "not-a-uri"})
    with pytest.raises(ClientError) as exc:
        sm.create_optimization_job(OptimizationJobName=unique, **args)
    code, msg = err(exc)
    assert code == "ValidationException"
    assert msg.startswith("2 validation errors detected: ")
    assert "Value 'ml.bogus.type' at 'deploymentInstanceType'" in msg
    assert "Value 'not-a-uri' at 'outputConfig.s3OutputLocation'" in msg


def test_too_many_optimization_configs(sm, unique):
    one = {"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}
    with pytest.raises(ClientError) as exc:
        sm.create_optimization_job(OptimizationJobName=unique,
                                   **job_args(OptimizationConfigs=[one] * 11))
    assert "at 'optimizationConfigs' failed to satisfy constraint: Member must have length " \
           "less than or equal to 10" in err(exc)[1]


def test_stop_then_delete(sm, unique):
    sm.create_optimization_job(OptimizationJobName=unique, **job_args())
    sm.stop_optimization_job(OptimizationJobName=unique)
    d = sm.describe_optimization_job(OptimizationJobName=unique)
    assert d["OptimizationJobStatus"] == "STOPPED"  # no worker owned it: stops at once
    assert d["OptimizationEndTime"] >= d["CreationTime"]
    with pytest.raises(ClientError) as exc:
        sm.stop_optimization_job(OptimizationJobName=unique)
    assert err(exc)[0] == "ValidationException"
    assert "STOPPED and cannot be stopped" in err(exc)[1]
    sm.delete_optimization_job(OptimizationJobName=unique)
    with pytest.raises(sm.exceptions.ResourceNotFound):
        sm.describe_optimization_job(OptimizationJobName=unique)


def test_list_filters(sm, unique):
    for i in range(3):
        sm.create_optimization_job(OptimizationJobName=f"{unique}-{i}", **job_args())
    sm.stop_optimization_job(OptimizationJobName=f"{unique}-1")
    jobs = sm.list_optimization_jobs(NameContains=unique)["OptimizationJobSummaries"]
    assert [j["OptimizationJobName"] for j in jobs] == [f"{unique}-{i}" for i in range(3)]
    assert jobs[0]["OptimizationTypes"] == ["SpeculativeDecoding"]
    assert jobs[0]["DeploymentInstanceType"] == "ml.g5.2xlarge"
    stopped = sm.list_optimization_jobs(NameContains=unique, StatusEquals="STOPPED")
    assert [j["OptimizationJobName"] for j in stopped["OptimizationJobSummaries"]] == \
        [f"{unique}-1"]
    by_type = sm.list_optimization_jobs(NameContains=unique, OptimizationContains="Quantization")
    assert by_type["OptimizationJobSummaries"] == []
    desc = sm.list_optimization_jobs(NameContains=unique, SortBy="Name", SortOrder="Descending")
    assert [j["OptimizationJobName"] for j in desc["OptimizationJobSummaries"]] == \
        [f"{unique}-{i}" for i in (2, 1, 0)]
    with pytest.raises(ClientError) as exc:
        sm.list_optimization_jobs(StatusEquals="RUNNING")
    assert err(exc)[0] == "ValidationException"


def test_output_model_name_must_be_free(sm, unique):
    """The output SageMakerModel is registered when the job completes: a name already taken
    is refused up front, not after the training (and nothing is created)."""
    taken = f"{unique}-out"
    sm.create_model(ModelName=taken, ExecutionRoleArn=ROLE, PrimaryContainer={"Image": "x"})
    args = job_args(OutputConfig={"S3OutputLocation": "s3://bucket/output/",
                                  "SageMakerModel": {"ModelName": taken}})
    with pytest.raises(ClientError) as exc:
        sm.create_optimization_job(OptimizationJobName=unique, **args)
    assert err(exc) == ("ValidationException",
                        "OutputConfig.SageMakerModel.ModelName: cannot create already existing "
                        f'model "arn:aws:sagemaker:us-east-1:123456789012:model/{taken.lower()}"'
                        "; name a model that does not exist yet.")
    with pytest.raises(sm.exceptions.ResourceNotFound):
        sm.describe_optimization_job(OptimizationJobName=unique)
    sm.delete_model(ModelName=taken)
    sm.create_optimization_job(OptimizationJobName=unique, **args)  # free again: accepted


def test_refused_deployment_instance_type(sm, unique):
    """Trainium (and Inferentia, Gaudi, K80) types pass botocore's enum but cannot run
    EagleNest's engines (foundation/instance_types.py): refused, nothing created."""
    with pytest.raises(ClientError) as exc:
        sm.create_optimization_job(OptimizationJobName=unique,
                                   **job_args(DeploymentInstanceType="ml.trn1.2xlarge"))
    assert err(exc) == (
        "ValidationException",
        "DeploymentInstanceType ml.trn1.2xlarge is not supported by EagleNest: its AWS "
        "Trainium chips run models only through the AWS Neuron SDK, which EagleNest's engines "
        "(vLLM on CUDA, the embedded PyTorch engine) do not use; choose a GPU type (g5, g6, "
        "g6e, p4d, p5 ...) or a CPU type (m5, c6i ...).")
    with pytest.raises(sm.exceptions.ResourceNotFound):
        sm.describe_optimization_job(OptimizationJobName=unique)
    for accepted in ("ml.g5.12xlarge", "ml.p5.48xlarge"):  # the enum holds no CPU type
        name = f"{unique}-{accepted.split('.')[1]}"
        sm.create_optimization_job(OptimizationJobName=name,
                                   **job_args(DeploymentInstanceType=accepted))
        assert sm.describe_optimization_job(OptimizationJobName=name)[
            "DeploymentInstanceType"] == accepted
