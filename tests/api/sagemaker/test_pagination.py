"""NextToken/MaxResults pagination over more than one page, for every List operation."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"
IMAGE = {"Image": "lmi:latest"}


def test_list_models_pages_cover_everything_once(sm, unique):
    names = [f"{unique}-{i:02d}" for i in range(7)]
    for n in names:
        sm.create_model(ModelName=n, ExecutionRoleArn=ROLE, PrimaryContainer=IMAGE)
    seen, token, pages = [], None, 0
    while True:
        kw = {"NextToken": token} if token else {}
        out = sm.list_models(NameContains=unique, MaxResults=3, SortBy="Name",
                             SortOrder="Ascending", **kw)
        assert len(out["Models"]) <= 3
        seen += [m["ModelName"] for m in out["Models"]]
        pages += 1
        token = out.get("NextToken")
        if not token:
            break
    assert seen == names
    assert pages == 3


def test_paginator_works(sm, unique):
    for i in range(5):
        sm.create_model(ModelName=f"{unique}-{i}", ExecutionRoleArn=ROLE, PrimaryContainer=IMAGE)
    pages = list(sm.get_paginator("list_models").paginate(
        NameContains=unique, PaginationConfig={"PageSize": 2}))
    assert [len(p["Models"]) for p in pages] == [2, 2, 1]


def test_token_from_another_query_is_rejected(sm, unique):
    for i in range(3):
        sm.create_model(ModelName=f"{unique}-{i}", ExecutionRoleArn=ROLE, PrimaryContainer=IMAGE)
    token = sm.list_models(NameContains=unique, MaxResults=1)["NextToken"]
    with pytest.raises(ClientError) as exc:
        sm.list_models(NameContains=unique, MaxResults=1, SortBy="Name", NextToken=token)
    assert exc.value.response["Error"]["Code"] == "ValidationException"
    assert "NextToken" in exc.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as exc:
        sm.list_models(NextToken="garbage!!")
    assert exc.value.response["Error"]["Code"] == "ValidationException"


def test_list_endpoint_configs_endpoints_and_jobs_paginate(sm, unique):
    sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE, PrimaryContainer=IMAGE)
    variant = {"VariantName": "v", "ModelName": unique, "InstanceType": "ml.g5.2xlarge",
               "InitialInstanceCount": 1}
    job = {
        "RoleArn": ROLE, "ModelSource": {"SageMakerModel": {"ModelName": unique}},
        "DeploymentInstanceType": "ml.g5.2xlarge",
        "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
        "OutputConfig": {"S3OutputLocation": "s3://bucket/out/"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }
    for i in range(3):
        sm.create_endpoint_config(EndpointConfigName=f"{unique}-{i}", ProductionVariants=[variant])
        sm.create_endpoint(EndpointName=f"{unique}-{i}", EndpointConfigName=f"{unique}-{i}")
        sm.create_optimization_job(OptimizationJobName=f"{unique}-{i}", **job)
    for op, key, name_key in (
        ("list_endpoint_configs", "EndpointConfigs", "EndpointConfigName"),
        ("list_endpoints", "Endpoints", "EndpointName"),
        ("list_optimization_jobs", "OptimizationJobSummaries", "OptimizationJobName"),
    ):
        pages = list(sm.get_paginator(op).paginate(
            NameContains=unique, PaginationConfig={"PageSize": 2}))
        names = [item[name_key] for p in pages for item in p[key]]
        assert [len(p[key]) for p in pages] == [2, 1], op
        assert sorted(names) == [f"{unique}-{i}" for i in range(3)], op
