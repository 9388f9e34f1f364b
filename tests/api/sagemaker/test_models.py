"""CreateModel / DescribeModel / ListModels / DeleteModel through a real boto3 client."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import boto3
import botocore.loaders
import botocore.session
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.support.stack import ACCESS_KEY, REGION, SECRET_KEY

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"
ARN_PREFIX = "arn:aws:sagemaker:us-east-1:123456789012"


def container(**extra: object) -> dict[str, object]:
    return {
        "Image": "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.33.0-lmi15.0.0-cu128",
        "ModelDataSource": {"S3DataSource": {"S3Uri": "s3://bucket/models/smollm2/",
                                             "S3DataType": "S3Prefix",
                                             "CompressionType": "None"}},
        "Environment": {"OPTION_TENSOR_PARALLEL_DEGREE": "1"},
        **extra,
    }


def error(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, str, int]:
    e = exc.value.response
    return e["Error"]["Code"], e["Error"]["Message"], e["ResponseMetadata"]["HTTPStatusCode"]


def test_create_describe_delete_round_trip(sm, unique):
    additional = [{"ChannelName": "eagle_model", "S3DataSource": {
        "S3Uri": "s3://bucket/heads/h1/", "S3DataType": "S3Prefix", "CompressionType": "None"}}]
    out = sm.create_model(
        ModelName=unique, ExecutionRoleArn=ROLE,
        PrimaryContainer=container(AdditionalModelDataSources=additional),
        Tags=[{"Key": "team", "Value": "ml"}], EnableNetworkIsolation=True,
    )
    assert out["ModelArn"] == f"{ARN_PREFIX}:model/{unique.lower()}"
    assert out["ResponseMetadata"]["RequestId"]
    d = sm.describe_model(ModelName=unique)
    assert d["ModelName"] == unique
    assert d["ModelArn"] == out["ModelArn"]
    assert d["ExecutionRoleArn"] == ROLE
    assert d["EnableNetworkIsolation"] is True
    assert d["PrimaryContainer"] == container(AdditionalModelDataSources=additional)
    assert d["CreationTime"].tzinfo is not None
    sm.delete_model(ModelName=unique)
    with pytest.raises(ClientError) as exc:
        sm.describe_model(ModelName=unique)
    assert error(exc) == ("ValidationException",
                          f'Could not find model "{ARN_PREFIX}:model/{unique.lower()}".', 400)


def test_duplicate_name_is_rejected_and_first_model_kept(sm, unique):
    sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE, PrimaryContainer=container())
    with pytest.raises(ClientError) as exc:
        sm.create_model(ModelName=unique.upper(), ExecutionRoleArn=ROLE,
                        PrimaryContainer=container(Image="other"))
    code, msg, status = error(exc)
    assert (code, status) == ("ValidationException", 400)
    assert msg == f'Cannot create already existing model "{ARN_PREFIX}:model/{unique.lower()}".'
    assert sm.describe_model(ModelName=unique)["PrimaryContainer"]["Image"] != "other"


def test_delete_missing_model(sm):
    with pytest.raises(ClientError) as exc:
        sm.delete_model(ModelName="no-such-model")
    assert error(exc)[0] == "ValidationException"
    assert "Could not find model" in error(exc)[1]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"ModelName": "bad_name!"},
         "1 validation error detected: Value 'bad_name!' at 'modelName' failed to satisfy "
         "constraint: Member must satisfy regular expression pattern: "
         "[a-zA-Z0-9]([\\-a-zA-Z0-9]*[a-zA-Z0-9])?"),
        ({"ModelName": "m" * 64},
         f"1 validation error detected: Value '{'m' * 64}' at 'modelName' failed to satisfy "
         "constraint: Member must have length less than or equal to 63"),
        ({"ExecutionRoleArn": "arn:aws:iam::12:role/x-too-short-account"},
         "1 validation error detected: Value 'arn:aws:iam::12:role/x-too-short-account' at "
         "'executionRoleArn' failed to satisfy constraint: Member must satisfy regular "
         "expression pattern: arn:aws[a-z\\-]*:iam::\\d{12}:role/?[a-zA-Z_0-9+=,.@\\-_/]+"),
    ],
)
def test_validation_errors_change_nothing(sm, unique, kwargs, expected):
    args = {"ModelName": unique, "ExecutionRoleArn": ROLE, "PrimaryContainer": container()}
    args.update(kwargs)
    before = sm.list_models(MaxResults=100, NameContains=unique)["Models"]
    with pytest.raises(ClientError) as exc:
        sm.create_model(**args)
    assert error(exc) == ("ValidationException", expected, 400)
    assert sm.list_models(MaxResults=100, NameContains=unique)["Models"] == before


def test_bad_s3_uri_in_nested_member(sm, unique):
    bad = container()
    bad["ModelDataSource"]["S3DataSource"]["S3Uri"] = "not-a-uri"  # type: ignore[index]
    with pytest.raises(ClientError) as exc:
        sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE, PrimaryContainer=bad)
    code, msg, _ = error(exc)
    assert code == "ValidationException"
    assert "Value 'not-a-uri' at 'primaryContainer.modelDataSource.s3DataSource.s3Uri'" in msg
    assert "Member must satisfy regular expression pattern" in msg


def test_list_models_filters_and_sorting(sm, unique):
    names = [f"{unique}-{i}" for i in range(3)]
    for i, n in enumerate(names):
        sm.create_model(ModelName=n, ExecutionRoleArn=ROLE, PrimaryContainer=container())
        if i == 0:
            time.sleep(1.2)  # botocore sends whole epoch seconds: leave a gap of > 1 s
    listed = [m["ModelName"] for m in sm.list_models(NameContains=unique, MaxResults=100)["Models"]]
    assert listed == list(reversed(names))  # default: CreationTime, Descending
    asc = sm.list_models(NameContains=unique, SortBy="Name", SortOrder="Ascending")["Models"]
    assert [m["ModelName"] for m in asc] == sorted(names)
    cut = sm.describe_model(ModelName=names[0])["CreationTime"] + timedelta(seconds=1)
    after = sm.list_models(NameContains=unique, CreationTimeAfter=cut)["Models"]
    assert {m["ModelName"] for m in after} == set(names[1:])
    before = sm.list_models(NameContains=unique, CreationTimeBefore=cut)["Models"]
    assert [m["ModelName"] for m in before] == names[:1]


def test_list_models_max_results_above_100_rejected(sm):
    with pytest.raises(ClientError) as exc:
        sm.list_models(MaxResults=1000)
    assert error(exc) == (
        "ValidationException",
        "1 validation error detected: Value '1000' at 'maxResults' failed to satisfy "
        "constraint: Member must have value less than or equal to 100",
        400,
    )


def test_list_models_bad_sort_key(sm):
    with pytest.raises(ClientError) as exc:
        sm.list_models(SortBy="Status")
    assert error(exc)[0] == "ValidationException"
    assert "Member must satisfy enum value set: [Name, CreationTime]" in error(exc)[1]


def newer_sagemaker_client(stack, folder):  # type: ignore[no-untyped-def]
    """A boto3 client whose service model has members our shapes lack, as a boto3 newer than
    the locked one would: FutureSetting on CreateModel and FutureOption on its container."""
    raw = botocore.loaders.Loader().load_service_model("sagemaker", "service-2")
    raw["shapes"]["CreateModelInput"]["members"]["FutureSetting"] = {"shape": "ModelName"}
    raw["shapes"]["ContainerDefinition"]["members"]["FutureOption"] = {"shape": "ModelName"}
    where = folder / "sagemaker" / raw["metadata"]["apiVersion"]
    where.mkdir(parents=True)
    (where / "service-2.json").write_text(json.dumps(raw))
    core = botocore.session.get_session()
    core.set_config_variable("data_path", str(folder))
    session = boto3.session.Session(botocore_session=core)
    return session.client("sagemaker", endpoint_url=stack.url, region_name=REGION,
                          aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                          config=Config(retries={"total_max_attempts": 1}))


def test_members_of_a_newer_botocore_are_ignored(stack, sm, unique, tmp_path):
    newer = newer_sagemaker_client(stack, tmp_path)
    newer.create_model(ModelName=unique, ExecutionRoleArn=ROLE, FutureSetting="on",
                       PrimaryContainer=container(FutureOption="fast"))
    described = sm.describe_model(ModelName=unique)
    assert described["PrimaryContainer"]["Environment"] == {"OPTION_TENSOR_PARALLEL_DEGREE": "1"}
    assert "FutureSetting" not in described and "FutureOption" not in described["PrimaryContainer"]
    # known members are still validated, and the message names the known one only
    with pytest.raises(ClientError) as exc:
        newer.create_model(ModelName=unique + "-2", ExecutionRoleArn="arn:aws:iam::123:role/nope",
                           FutureSetting="on", PrimaryContainer=container(FutureOption="x"))
    code, message, status = error(exc)
    assert (code, status) == ("ValidationException", 400)
    assert "executionRoleArn" in message and "Future" not in message
    with pytest.raises(ClientError):
        sm.describe_model(ModelName=unique + "-2")


def test_a_model_needs_exactly_one_of_primary_container_and_containers(sm, unique):
    with pytest.raises(ClientError) as exc:
        sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE)
    assert error(exc) == ("ValidationException", "Either PrimaryContainer or Containers must be "
                          "specified: a model needs at least one container.", 400)
    with pytest.raises(ClientError) as exc:
        sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE, PrimaryContainer=container(),
                        Containers=[container()])
    assert error(exc)[:2] == ("ValidationException", "PrimaryContainer and Containers cannot "
                              "both be specified: use PrimaryContainer for one container or "
                              "Containers for an inference pipeline.")
    with pytest.raises(ClientError):
        sm.describe_model(ModelName=unique)
    sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE, Containers=[container()])
    assert sm.describe_model(ModelName=unique)["Containers"] == [container()]
