"""Environment confinement: in a caller's container Environment / OptimizationEnvironment,
anything that makes Python or vLLM load code or reach the network is refused at Create time,
other unknown names (HF_TOKEN...) are accepted and echoed but reach no process, and a model
server starts from a minimal environment without a single setting of the control plane."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from botocore.exceptions import ClientError

from tests.security.conftest import (
    ROLE,
    SENTINEL,
    SERVING_ENV,
    container,
    deploy,
    error_of,
    instances,
)
from tests.support.jobs import ROOT
from tests.support.stack import ACCESS_KEY, SECRET_KEY, Stack

#: what existing SageMaker scripts send: accepted, echoed by Describe, passed to no process
SAGEMAKER_SCRIPT = {"HF_TOKEN": "hf_secret_of_the_caller", "HF_MODEL_ID": "org/model"}

ATTACKS = [
    # the proof of concept: `import antigravity` opens BROWSER, a shell command
    {"PYTHONWARNINGS": "ignore::antigravity.x", "BROWSER": "sh -c 'id' #%s"},
    {"LD_PRELOAD": "/tmp/evil.so"},
    {"PYTHONPATH": "/tmp/evil"},
    {"HF_HUB_OFFLINE": "0"},
    {"VLLM_PLUGINS": "evil"},
    {"OPTION_TRUST_REMOTE_CODE": "true"},
    {"EAGLENEST_BROKER_URL": "redis://attacker:6379/0"},
]


@pytest.mark.parametrize("env", ATTACKS, ids=lambda e: ",".join(e))
def test_create_model_refuses_variables_that_run_code(secure: Stack, env: dict[str, str]
                                                      ) -> None:
    sm = secure.client()
    name = f"evil-{sorted(env)[0].lower().replace('_', '-')}"
    with pytest.raises(ClientError) as exc:
        sm.create_model(ModelName=name, ExecutionRoleArn=ROLE,
                        PrimaryContainer=container({**SERVING_ENV, **env}))
    code, message = error_of(exc)
    assert code == "ValidationException"
    assert f"Environment variable {sorted(env)[0]} in PrimaryContainer.Environment is not " \
           "allowed" in message
    with pytest.raises(ClientError, match="Could not find model"):
        sm.describe_model(ModelName=name)
    assert name not in [m["ModelName"] for m in sm.list_models(MaxResults=100)["Models"]]


def test_pipeline_containers_are_checked_too(secure: Stack) -> None:
    sm = secure.client()
    with pytest.raises(ClientError) as exc:
        sm.create_model(ModelName="evil-pipeline", ExecutionRoleArn=ROLE, Containers=[
            container(), container({"LD_PRELOAD": "/tmp/x.so"})])
    assert error_of(exc)[1].startswith(
        "Environment variable LD_PRELOAD in Containers.2.Environment is not allowed")


def test_create_optimization_job_refuses_unknown_variables(secure: Stack) -> None:
    sm = secure.client()
    with pytest.raises(ClientError) as exc:
        sm.create_optimization_job(
            OptimizationJobName="evil-job", RoleArn=ROLE,
            ModelSource={"S3": {"S3Uri": "s3://models/tiny/"}},
            DeploymentInstanceType="ml.g5.2xlarge",
            OptimizationEnvironment={"EAGLENEST_MAX_STEPS": "1", "PYTHONPATH": "/tmp/evil"},
            OptimizationConfigs=[{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
            OutputConfig={"S3OutputLocation": "s3://output/evil/"},
            StoppingCondition={"MaxRuntimeInSeconds": 60})
    code, message = error_of(exc)
    assert code == "ValidationException"
    assert message.startswith("Environment variable PYTHONPATH in OptimizationEnvironment is "
                              "not allowed")
    with pytest.raises(ClientError, match="does not exist"):
        sm.describe_optimization_job(OptimizationJobName="evil-job")


def test_model_server_environment_holds_no_control_plane_setting(secure: Stack,
                                                                 served: str) -> None:
    (inst,) = instances(secure, served)
    env = psutil.Process(inst["pid"]).environ()
    values = "\n".join(env.values())
    for secret in (SECRET_KEY, ACCESS_KEY, str(secure.data_dir / "eaglenest.db"),
                   "redis://", SENTINEL[1]):
        assert secret not in values
    ours = {"EAGLENEST_CHILD_TAG", "EAGLENEST_INSTANCE_SECRET", "EAGLENEST_COMPUTE_SHARING",
            *SERVING_ENV}
    assert not [k for k in env if k.startswith(("AWS_", "EAGLENEST_")) and k not in ours]
    assert env["OMP_NUM_THREADS"] == "1"  # an allowed entry of the container's Environment
    assert env["HF_HUB_OFFLINE"] == "1" and Path(env["PATH"].split(":")[0]).is_absolute()


def status_under(stack: Stack, row: str) -> list[str]:
    """The warnings (`ignores ...` lines) `eaglenest status` prints under its first row of
    resource `row` (an endpoint's other lines, such as its variants' backends, are left out)."""
    r = subprocess.run([sys.executable, "-m", "eaglenest.cli", "status"],
                       env=stack.env(), capture_output=True, text=True, cwd=ROOT, check=False)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {row} "))
    below = []
    for line in lines[start + 1:]:
        if not line.startswith("    "):
            break
        if line.strip().startswith("ignores "):
            below.append(line)
    return below


def test_create_model_accepts_the_names_sagemaker_scripts_send(secure: Stack) -> None:
    sm = secure.client()
    env = {**SERVING_ENV, **SAGEMAKER_SCRIPT, "SM_NUM_GPUS": "1"}
    sm.create_model(ModelName="sagemaker-script", ExecutionRoleArn=ROLE,
                    PrimaryContainer=container(env))
    described = sm.describe_model(ModelName="sagemaker-script")
    assert described["PrimaryContainer"]["Environment"] == env


@pytest.mark.parametrize("name", ["LD_AUDIT", "http_proxy", "VLLM_USE_V1"])
def test_create_model_refuses_denied_prefixes(secure: Stack, name: str) -> None:
    sm = secure.client()
    model = f"denied-{name.lower().replace('_', '-')}"
    with pytest.raises(ClientError) as exc:
        sm.create_model(ModelName=model, ExecutionRoleArn=ROLE,
                        PrimaryContainer=container({**SERVING_ENV, name: "x"}))
    code, message = error_of(exc)
    assert code == "ValidationException"
    assert message.startswith(f"Environment variable {name} in PrimaryContainer.Environment "
                              "is not allowed")
    with pytest.raises(ClientError, match="Could not find model"):
        sm.describe_model(ModelName=model)


def test_create_optimization_job_accepts_ignored_variables(secure: Stack) -> None:
    sm = secure.client()
    env = {"EAGLENEST_MAX_STEPS": "1", "HF_TOKEN": "hf_x"}
    sm.create_optimization_job(
        OptimizationJobName="hf-token-job", RoleArn=ROLE,
        ModelSource={"S3": {"S3Uri": "s3://models/tiny/"}},
        DeploymentInstanceType="ml.g5.2xlarge", OptimizationEnvironment=env,
        OptimizationConfigs=[{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
        OutputConfig={"S3OutputLocation": "s3://output/hf-token-job/"},
        StoppingCondition={"MaxRuntimeInSeconds": 60})
    described = sm.describe_optimization_job(OptimizationJobName="hf-token-job")
    assert described["OptimizationEnvironment"] == env
    assert status_under(secure, "hf-token-job") == [
        "    ignores OptimizationEnvironment variables HF_TOKEN: EagleNest does not pass them "
        "to the model server or any process it starts (docs/security.md)"]
    sm.stop_optimization_job(OptimizationJobName="hf-token-job")  # no train worker here


def test_ignored_variables_reach_no_model_server(secure: Stack) -> None:
    """A model holding HF_TOKEN and HF_MODEL_ID serves; its process has neither, but has
    the allowed OMP_NUM_THREADS; the worker's log and `eaglenest status` name them."""
    sm = secure.client()
    name = "ignored-env"
    sm.create_model(ModelName=name, ExecutionRoleArn=ROLE,
                    PrimaryContainer=container({**SERVING_ENV, **SAGEMAKER_SCRIPT}))
    deploy(sm, name, name)
    try:
        sm.get_waiter("endpoint_in_service").wait(
            EndpointName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 240})
        (inst,) = instances(secure, name)
        env = psutil.Process(inst["pid"]).environ()
        assert "HF_TOKEN" not in env and "HF_MODEL_ID" not in env
        assert SAGEMAKER_SCRIPT["HF_TOKEN"] not in "\n".join(env.values())
        assert env["OMP_NUM_THREADS"] == "1"  # an allowed entry of the same Environment
        note = ("ignores Environment variables HF_MODEL_ID, HF_TOKEN of model ignored-env: "
                "EagleNest does not pass them to the model server or any process it starts")
        assert f"variant AllTraffic of endpoint config {name} {note}" in secure.log()
        assert status_under(secure, name) == [f"    {note} (docs/security.md)"]
    finally:
        sm.delete_endpoint(EndpointName=name)
