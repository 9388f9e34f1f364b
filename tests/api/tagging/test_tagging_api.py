"""The Resource Groups Tagging API (GetResources, TagResources, UntagResources) through
boto3's resourcegroupstaggingapi client, on the same endpoint as SageMaker."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from tests.api.sagemaker.test_optimization_jobs import job_args

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"


@pytest.fixture
def tagged(sm, unique):
    """One tagged resource of each type (tag suite=<unique>), plus an untagged model."""
    def tags(kind: str) -> list[dict[str, str]]:
        return [{"Key": "suite", "Value": unique}, {"Key": "kind", "Value": kind}]

    arns = {"model": sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE, Tags=tags("m"),
                                     PrimaryContainer={"Image": "lmi"})["ModelArn"]}
    arns["endpoint-config"] = sm.create_endpoint_config(
        EndpointConfigName=unique, Tags=tags("c"), ProductionVariants=[{
            "VariantName": "AllTraffic", "ModelName": unique, "InstanceType": "ml.g5.2xlarge",
            "InitialInstanceCount": 1}])["EndpointConfigArn"]
    arns["endpoint"] = sm.create_endpoint(EndpointName=unique, EndpointConfigName=unique,
                                          Tags=tags("e"))["EndpointArn"]
    arns["optimization-job"] = sm.create_optimization_job(
        OptimizationJobName=unique, **job_args(Tags=tags("j")))["OptimizationJobArn"]
    arns["untagged"] = sm.create_model(ModelName=unique + "-bare", ExecutionRoleArn=ROLE,
                                       PrimaryContainer={"Image": "lmi"})["ModelArn"]
    return arns


@pytest.fixture
def rg(stack):
    return stack.client("resourcegroupstaggingapi")


def arns_of(out: dict) -> list[str]:
    return [r["ResourceARN"] for r in out["ResourceTagMappingList"]]


def test_tag_and_type_filters(rg, tagged, unique):
    suite = [{"Key": "suite", "Values": [unique]}]
    out = rg.get_resources(TagFilters=suite)
    expected = sorted(a for k, a in tagged.items() if k != "untagged")
    assert arns_of(out) == expected and out["PaginationToken"] == ""
    first = out["ResourceTagMappingList"][expected.index(tagged["model"])]
    assert first["Tags"] == [{"Key": "suite", "Value": unique}, {"Key": "kind", "Value": "m"}]
    assert arns_of(rg.get_resources(TagFilters=suite, ResourceTypeFilters=[
        "sagemaker:model", "sagemaker:endpoint"])) == sorted([tagged["model"], tagged["endpoint"]])
    assert arns_of(rg.get_resources(TagFilters=suite, ResourceTypeFilters=["sagemaker"])) == \
        expected
    assert arns_of(rg.get_resources(TagFilters=suite, ResourceTypeFilters=["ec2:instance"])) == []
    both = suite + [{"Key": "kind", "Values": ["c", "j"]}]
    assert arns_of(rg.get_resources(TagFilters=both)) == sorted(
        [tagged["endpoint-config"], tagged["optimization-job"]])
    assert tagged["model"] in arns_of(rg.get_resources(TagFilters=[{"Key": "kind"}],
                                                       ResourcesPerPage=100))
    out = rg.get_resources(ResourceARNList=[tagged["untagged"], tagged["model"]])
    assert out["ResourceTagMappingList"][1] == {"ResourceARN": tagged["untagged"], "Tags": []}


def test_pagination(rg, tagged, unique):
    suite = [{"Key": "suite", "Values": [unique]}]
    pages = list(rg.get_paginator("get_resources").paginate(TagFilters=suite,
                                                             ResourcesPerPage=1))
    assert [len(p["ResourceTagMappingList"]) for p in pages] == [1, 1, 1, 1]
    assert sum((arns_of(p) for p in pages), []) == sorted(
        a for k, a in tagged.items() if k != "untagged")
    token = rg.get_resources(TagFilters=suite, ResourcesPerPage=1)["PaginationToken"]
    for kw in ({"PaginationToken": "garbage"},
               {"PaginationToken": token, "ResourcesPerPage": 2}):  # another query's token
        with pytest.raises(ClientError) as exc:
            rg.get_resources(TagFilters=suite, **{"ResourcesPerPage": 1, **kw})
        assert exc.value.response["Error"]["Code"] == "InvalidParameterException"
        assert "PaginationToken is not valid" in exc.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as exc:
        rg.get_resources(ResourcesPerPage=101)
    assert exc.value.response["Error"]["Code"] == "InvalidParameterException"
    with pytest.raises(ClientError) as exc:
        rg.get_resources(ResourceARNList=[tagged["model"]], TagFilters=suite)
    assert exc.value.response["Error"]["Code"] == "InvalidParameterException"


def test_tag_and_untag_resources(rg, sm, tagged, unique):
    missing = tagged["model"] + "-gone"
    out = rg.tag_resources(ResourceARNList=[tagged["model"], missing], Tags={"stage": "prod"})
    assert out["FailedResourcesMap"] == {missing: {
        "StatusCode": 400, "ErrorCode": "InvalidParameterException",
        "ErrorMessage": f'Resource does not exist: "{missing}".'}}
    assert {"Key": "stage", "Value": "prod"} in sm.list_tags(ResourceArn=tagged["model"])["Tags"]
    assert arns_of(rg.get_resources(TagFilters=[{"Key": "suite", "Values": [unique]},
                                                {"Key": "stage", "Values": ["prod"]}])) == \
        [tagged["model"]]
    out = rg.tag_resources(ResourceARNList=[tagged["endpoint"]], Tags={"aws:x": "1"})
    assert out["FailedResourcesMap"][tagged["endpoint"]]["ErrorCode"] == \
        "InvalidParameterException"  # the service's ErrorCode enum has no ValidationException
    assert rg.untag_resources(ResourceARNList=[tagged["model"]],
                              TagKeys=["suite", "stage"])["FailedResourcesMap"] == {}
    assert sm.list_tags(ResourceArn=tagged["model"])["Tags"] == [{"Key": "kind", "Value": "m"}]


def test_signed_for_the_tagging_service_only(signed_post):
    r = signed_post("ResourceGroupsTaggingAPI_20170126.GetResources", b"{}")
    assert r.status_code == 403
    assert r.json() == {"__type": "InvalidSignatureException",
                        "message": "Credential should be scoped to correct service: 'tagging'."}


def test_constraints_of_the_services_shapes_are_invalid_parameters(rg, tagged):
    with pytest.raises(ClientError) as exc:  # TagKey: at most 128 characters
        rg.tag_resources(ResourceARNList=[tagged["model"]], Tags={"k" * 129: "v"})
    err = exc.value.response["Error"]
    assert err["Code"] == "InvalidParameterException"
    assert "failed to satisfy constraint" in err["Message"] and "tags" in err["Message"]
    with pytest.raises(ClientError) as exc:  # at most 20 ARNs per TagResources
        rg.tag_resources(ResourceARNList=[tagged["model"]] * 21, Tags={"k": "v"})
    assert exc.value.response["Error"]["Code"] == "InvalidParameterException"
    assert "resourceARNList" in exc.value.response["Error"]["Message"]
