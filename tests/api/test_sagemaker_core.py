"""sagemaker-core's resource API (sagemaker.core.resources: Model, EndpointConfig, Endpoint,
OptimizationJob, Tag), unmodified, against a real stack with its serve and job workers.

sagemaker-core builds its boto3 clients itself from a boto3 Session (no endpoint_url
argument): it is pointed at EagleNest the way a user would, with botocore's per-service
endpoint variables AWS_ENDPOINT_URL_SAGEMAKER / AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME.
Offline: importing sagemaker.core.resources and these calls open no connection but to the
endpoint URL (checked by `no_other_hosts`); its telemetry decorator is not on the resource
classes, and its defaults config is read only from local files unless
SAGEMAKER_USER_CONFIG_OVERRIDE / SAGEMAKER_ADMIN_CONFIG_OVERRIDE name an S3 URI (they are
cleared here).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.support.jobs import ROLE, job, upload
from tests.support.stack import ACCESS_KEY, REGION, SECRET_KEY, Stack

pytest.importorskip("sagemaker.core.resources")

ENV = {"EAGLENEST_SERVING_BACKEND": "embedded", "EAGLENEST_NUM_SPECULATIVE_TOKENS": "3",
       "EAGLENEST_MAX_MODEL_LEN": "512", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_llama_dir) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("sagemaker-core")).start()
    upload(s, tiny_llama_dir, "s3://models/tiny/")
    yield s
    s.stop()


@pytest.fixture
def session(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Any:
    import boto3

    for var in ("SAGEMAKER_USER_CONFIG_OVERRIDE", "SAGEMAKER_ADMIN_CONFIG_OVERRIDE",
                "AWS_PROFILE", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER", stack.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", stack.url)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # an error is reported, not retried
    return boto3.Session(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                         region_name=REGION)


@pytest.fixture
def no_other_hosts(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every address a socket connects to; the test asserts they are all the stack's."""
    seen: list[Any] = []
    connect = socket.socket.connect

    def record(sock: socket.socket, addr: Any) -> Any:
        seen.append(addr)
        return connect(sock, addr)

    monkeypatch.setattr(socket.socket, "connect", record)
    return seen


def _tags(r: Any, arn: str, session: Any) -> dict[str, str]:
    return {t.key: t.value for t in r.Tag.get_all(resource_arn=arn, session=session,
                                                  region=REGION)}


def test_lifecycle(stack: Stack, session: Any, no_other_hosts: list[Any]) -> None:
    import sagemaker.core.resources as r
    import sagemaker.core.shapes as sh

    t0 = time.monotonic()
    kw = {"session": session, "region": REGION}
    model = r.Model.create(
        model_name="smc-model", execution_role_arn=ROLE,
        primary_container=sh.ContainerDefinition(
            image="eaglenest", environment=ENV,
            model_data_source=sh.ModelDataSource(s3_data_source=sh.S3ModelDataSource(
                s3_uri="s3://models/tiny/", s3_data_type="S3Prefix",
                compression_type="None"))),
        tags=[sh.Tag(key="team", value="eagle")], **kw)
    assert model.model_arn.endswith(":model/smc-model")
    assert model.primary_container.environment == ENV
    config = r.EndpointConfig.create(
        endpoint_config_name="smc-config", production_variants=[sh.ProductionVariant(
            variant_name="AllTraffic", model_name=model, instance_type="ml.g5.2xlarge",
            initial_instance_count=1, container_startup_health_check_timeout_in_seconds=120)],
        **kw)
    assert config.production_variants[0].model_name == "smc-model"
    endpoint = r.Endpoint.create(endpoint_name="smc-endpoint", endpoint_config_name=config,
                                 **kw)
    assert endpoint.endpoint_status == "Creating"
    endpoint.wait_for_status("InService", poll=1, timeout=300)
    variant = endpoint.production_variants[0]
    assert (variant.current_instance_count, variant.current_weight) == (1, 1.0)

    out = endpoint.invoke(body=json.dumps({"inputs": "Natalia sold 48 clips",
                                           "parameters": {"max_new_tokens": 8}}),
                          content_type="application/json", **kw)
    assert out.invoked_production_variant == "AllTraffic"
    text = json.loads(out.body.read())["generated_text"]
    assert isinstance(text, str) and text
    # (Endpoint.invoke_with_response_stream is not used: sagemaker-core 2.27's codec
    # calls .get on botocore's EventStream, an AttributeError against AWS as well)
    with pytest.raises(ClientError) as err:  # the container's 4xx, as SageMaker reports it
        endpoint.invoke(body="not json", content_type="application/json", **kw)
    assert err.value.response["Error"]["Code"] == "ModelError"
    assert err.value.response["OriginalStatusCode"] == 400

    endpoint.update_weights_and_capacities(desired_weights_and_capacities=[
        sh.DesiredWeightAndCapacity(variant_name="AllTraffic", desired_weight=2.0,
                                    desired_instance_count=2)], **kw)
    endpoint.refresh()
    assert endpoint.endpoint_status == "Updating"
    assert endpoint.production_variants[0].desired_instance_count == 2
    endpoint.wait_for_status("InService", poll=1, timeout=300)
    variant = endpoint.production_variants[0]
    assert (variant.current_instance_count, variant.current_weight) == (2, 2.0)
    assert variant.deployed_images[0].resolved_image.startswith("eaglenest/embedded:")
    assert len(stack.deployment("smc-endpoint")["Servers"]["AllTraffic"]["instances"]) == 2

    assert _tags(r, model.model_arn, session) == {"team": "eagle"}  # given at create
    r.Tag.add_tags(resource_arn=endpoint.endpoint_arn, tags=[
        sh.Tag(key="stage", value="test"), sh.Tag(key="owner", value="core")], **kw)
    assert _tags(r, endpoint.endpoint_arn, session) == {"stage": "test", "owner": "core"}
    r.Tag.delete_tags(resource_arn=endpoint.endpoint_arn, tag_keys=["stage"], **kw)
    assert _tags(r, endpoint.endpoint_arn, session) == {"owner": "core"}

    spec = job("s3://models/tiny/")
    opt = r.OptimizationJob.create(
        optimization_job_name="smc-job", role_arn=spec["RoleArn"],
        model_source=sh.OptimizationJobModelSource(s3=sh.OptimizationJobModelSourceS3(
            s3_uri=spec["ModelSource"]["S3"]["S3Uri"])),
        deployment_instance_type=spec["DeploymentInstanceType"],
        optimization_environment=spec["OptimizationEnvironment"],
        optimization_configs=[sh.OptimizationConfig(
            model_speculative_decoding_config=sh.ModelSpeculativeDecodingConfig(
                technique="EAGLE"))],
        output_config=sh.OptimizationJobOutputConfig(
            s3_output_location=spec["OutputConfig"]["S3OutputLocation"]),
        stopping_condition=sh.StoppingCondition(max_runtime_in_seconds=1800),
        tags=[sh.Tag(key="kind", value="tiny")], **kw)
    opt.wait(poll=2, timeout=900)
    assert opt.optimization_job_status == "COMPLETED", opt.failure_reason
    # the backend the job benchmarked on (tests/support/jobs.py sets embedded)
    assert opt.optimization_output.recommended_inference_image == "embedded"
    assert opt.optimization_start_time <= opt.optimization_end_time
    assert _tags(r, opt.optimization_job_arn, session) == {"kind": "tiny"}
    assert [j.optimization_job_name for j in r.OptimizationJob.get_all(**kw)] == ["smc-job"]

    endpoint.delete()
    endpoint.wait_for_delete(poll=1, timeout=120)
    config.delete()
    model.delete()
    opt.delete()
    assert list(r.Endpoint.get_all(**kw)) == []
    assert list(r.EndpointConfig.get_all(**kw)) == []
    assert list(r.Model.get_all(**kw)) == []
    assert list(r.OptimizationJob.get_all(**kw)) == []
    ports = {a[1] for a in no_other_hosts if isinstance(a, tuple)}
    assert ports == {stack.port}, no_other_hosts
    print(f"sagemaker-core lifecycle: {time.monotonic() - t0:.0f} s")
