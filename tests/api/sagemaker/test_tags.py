"""AddTags / ListTags / DeleteTags through boto3 and the AWS CLI: every resource type, AWS's
limits, tags given at Create, tags gone with their resource."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ClientError

from tests.api.sagemaker.test_optimization_jobs import job_args
from tests.api.test_aws_cli import aws

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"
ACCOUNT_ARN = "arn:aws:sagemaker:us-east-1:123456789012"
T1 = [{"Key": "team", "Value": "nest"}, {"Key": "cost center", "Value": "42"}]


def code_and_message(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, str]:
    return exc.value.response["Error"]["Code"], exc.value.response["Error"]["Message"]


def make_all(sm, name: str, tags: list[dict[str, str]]) -> dict[str, str]:
    """One of each taggable resource, created with `tags`: kind -> ARN."""
    arns = {"model": sm.create_model(ModelName=name, ExecutionRoleArn=ROLE, Tags=tags,
                                     PrimaryContainer={"Image": "lmi"})["ModelArn"]}
    arns["endpoint-config"] = sm.create_endpoint_config(
        EndpointConfigName=name, Tags=tags, ProductionVariants=[{
            "VariantName": "AllTraffic", "ModelName": name, "InstanceType": "ml.g5.2xlarge",
            "InitialInstanceCount": 1}])["EndpointConfigArn"]
    arns["endpoint"] = sm.create_endpoint(EndpointName=name, EndpointConfigName=name,
                                          Tags=tags)["EndpointArn"]
    arns["optimization-job"] = sm.create_optimization_job(
        OptimizationJobName=name, **job_args(Tags=tags))["OptimizationJobArn"]
    return arns


def test_create_tags_are_listed_added_and_deleted_on_every_resource(sm, unique):
    arns = make_all(sm, unique, T1)
    for kind, arn in arns.items():
        assert sm.list_tags(ResourceArn=arn)["Tags"] == T1, kind
        out = sm.add_tags(ResourceArn=arn, Tags=[{"Key": "team", "Value": "eagle"},
                                                 {"Key": "new", "Value": ""}])
        assert out["Tags"] == [{"Key": "team", "Value": "eagle"}, {"Key": "new", "Value": ""}]
        listed = sm.list_tags(ResourceArn=arn)
        assert listed["Tags"] == [{"Key": "team", "Value": "eagle"}, T1[1],
                                  {"Key": "new", "Value": ""}], kind
        assert "NextToken" not in listed
        sm.delete_tags(ResourceArn=arn, TagKeys=["team", "not-there"])
        assert sm.list_tags(ResourceArn=arn)["Tags"] == [T1[1], {"Key": "new", "Value": ""}]


def test_arn_names_compare_ignoring_case(sm, unique):
    sm.create_model(ModelName=unique.upper(), ExecutionRoleArn=ROLE,
                    PrimaryContainer={"Image": "lmi"})
    sm.add_tags(ResourceArn=f"{ACCOUNT_ARN}:model/{unique.upper()}", Tags=T1[:1])
    assert sm.list_tags(ResourceArn=f"{ACCOUNT_ARN}:model/{unique.lower()}")["Tags"] == T1[:1]


def test_tags_go_with_their_resource(sm, unique):
    arn = sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE, Tags=T1,
                          PrimaryContainer={"Image": "lmi"})["ModelArn"]
    sm.delete_model(ModelName=unique)
    with pytest.raises(ClientError) as exc:
        sm.list_tags(ResourceArn=arn)
    assert code_and_message(exc) == ("ValidationException", f'Resource does not exist: "{arn}".')
    sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE, PrimaryContainer={"Image": "lmi"})
    assert sm.list_tags(ResourceArn=arn)["Tags"] == []


@pytest.mark.parametrize("arn", [
    f"{ACCOUNT_ARN}:model/missing", f"{ACCOUNT_ARN}:endpoint-config/missing",
    f"{ACCOUNT_ARN}:endpoint/missing", f"{ACCOUNT_ARN}:optimization-job/missing",
    f"{ACCOUNT_ARN}:training-job/missing", f"{ACCOUNT_ARN}:model",
])
def test_missing_resource_is_a_validation_exception(sm, arn):
    for call, kw in ((sm.add_tags, {"Tags": T1}), (sm.list_tags, {}),
                     (sm.delete_tags, {"TagKeys": ["team"]})):
        with pytest.raises(ClientError) as exc:
            call(ResourceArn=arn, **kw)
        assert code_and_message(exc) == ("ValidationException",
                                         f'Resource does not exist: "{arn}".')


def test_other_account_or_region_is_not_found(sm, unique):
    sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE, PrimaryContainer={"Image": "lmi"})
    for arn in (f"arn:aws:sagemaker:us-east-1:999999999999:model/{unique}",
                f"arn:aws:sagemaker:eu-west-1:123456789012:model/{unique}"):
        with pytest.raises(ClientError) as exc:
            sm.add_tags(ResourceArn=arn, Tags=T1)
        assert code_and_message(exc) == ("ValidationException",
                                         f'Resource does not exist: "{arn}".')


def test_limits_and_rules_change_nothing(sm, unique):
    arn = sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE, PrimaryContainer={
        "Image": "lmi"}, Tags=[{"Key": f"k{i}", "Value": "v"} for i in range(30)])["ModelArn"]
    cases = [
        ([{"Key": f"n{i}", "Value": "v"} for i in range(21)],
         "A resource can have at most 50 tags: this request would give it 51."),
        ([{"Key": f"n{i}", "Value": "v"} for i in range(51)],
         "1 validation error detected: Value '[{\"Key\":\"n0\",\"Value\":\"v\"},"),
        ([{"Key": "aws:owner", "Value": "me"}],
         "Tag keys beginning with 'aws:' are reserved for AWS use: 'aws:owner' at 'tags.key' "
         "is not allowed."),
        ([{"Key": "AWS:x", "Value": "me"}],
         "Tag keys beginning with 'aws:' are reserved for AWS use: 'AWS:x' at 'tags.key' "
         "is not allowed."),
        ([{"Key": "dup", "Value": "1"}, {"Key": "dup", "Value": "2"}],
         "Tag keys must be unique per resource: duplicate key 'dup' in 'tags'."),
        ([{"Key": "bad#key", "Value": "v"}],
         "1 validation error detected: Value 'bad#key' at 'tags.1.member.key' failed to "
         "satisfy constraint: Member must satisfy regular expression pattern: "
         "([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)"),
        ([{"Key": "k" * 129, "Value": "v"}],
         f"1 validation error detected: Value '{'k' * 129}' at 'tags.1.member.key' failed to "
         "satisfy constraint: Member must have length less than or equal to 128"),
        ([{"Key": "k", "Value": "v" * 257}],
         f"1 validation error detected: Value '{'v' * 253}...' at 'tags.1.member.value' "
         "failed to satisfy constraint: Member must have length less than or equal to 256"),
    ]
    for tags, message in cases:
        with pytest.raises(ClientError) as exc:
            sm.add_tags(ResourceArn=arn, Tags=tags)
        code, text = code_and_message(exc)
        assert code == "ValidationException"
        assert text.startswith(message), text
    assert len(sm.list_tags(ResourceArn=arn)["Tags"]) == 30
    with pytest.raises(ClientError) as exc:  # the same rules at Create; nothing is created
        sm.create_model(ModelName=unique + "-x", ExecutionRoleArn=ROLE, Tags=[
            {"Key": "aws:a", "Value": ""}], PrimaryContainer={"Image": "lmi"})
    assert "reserved for AWS use" in code_and_message(exc)[1]
    with pytest.raises(ClientError):
        sm.describe_model(ModelName=unique + "-x")
    with pytest.raises(ClientError) as exc:
        sm.add_tags(ResourceArn="arn:aws:iam::123456789012:role/x", Tags=T1)
    assert code_and_message(exc)[1].startswith(
        "1 validation error detected: Value 'arn:aws:iam::123456789012:role/x' at "
        "'resourceArn' failed to satisfy constraint: Member must satisfy regular expression")


def test_fifty_tags_fit_one_page_and_tokens_are_checked(sm, unique, signed_post):
    tags = [{"Key": f"key-{i:02d}", "Value": str(i)} for i in range(50)]
    arn = sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE, Tags=tags,
                          PrimaryContainer={"Image": "lmi"})["ModelArn"]
    out = sm.list_tags(ResourceArn=arn, MaxResults=50)
    assert out["Tags"] == tags and "NextToken" not in out
    assert sm.list_tags(ResourceArn=arn)["Tags"] == tags
    with pytest.raises(ClientError) as exc:
        sm.list_tags(ResourceArn=arn, NextToken="garbage")
    assert code_and_message(exc) == ("ValidationException",
                                     "Invalid pagination token: NextToken is malformed.")
    from eaglenest.db.tags_repo import page_token

    with pytest.raises(ClientError) as exc:  # a token of another resource's listing
        sm.list_tags(ResourceArn=arn, NextToken=page_token(arn + "x", 10))
    assert "belongs to another resource" in code_and_message(exc)[1]
    assert sm.list_tags(ResourceArn=arn, NextToken=page_token(arn, 45))["Tags"] == tags[45:]
    r = signed_post("SageMaker.ListTags", json.dumps({"ResourceArn": arn, "MaxResults": 10}
                                                     ).encode())  # boto3 checks min itself
    assert r.status_code == 400 and r.json()["__type"] == "ValidationException"
    assert "Member must have value greater than or equal to 50" in r.json()["message"]


def test_aws_cli_add_list_delete_tags(stack, sm, unique):
    arn = sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE,
                          PrimaryContainer={"Image": "lmi"})["ModelArn"]
    r = aws(stack, "add-tags", "--resource-arn", arn, "--tags", "Key=team,Value=nest",
            "Key=stage,Value=dev")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["Tags"] == [{"Key": "team", "Value": "nest"},
                                            {"Key": "stage", "Value": "dev"}]
    r = aws(stack, "list-tags", "--resource-arn", arn)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["Tags"] == [{"Key": "team", "Value": "nest"},
                                            {"Key": "stage", "Value": "dev"}]
    r = aws(stack, "delete-tags", "--resource-arn", arn, "--tag-keys", "team")
    assert r.returncode == 0, r.stderr
    r = aws(stack, "list-tags", "--resource-arn", arn)
    assert json.loads(r.stdout)["Tags"] == [{"Key": "stage", "Value": "dev"}]
    r = aws(stack, "add-tags", "--resource-arn", arn, "--tags", "Key=aws:x,Value=y")
    assert r.returncode != 0 and "ValidationException" in r.stderr
    assert "reserved for AWS use" in r.stderr
