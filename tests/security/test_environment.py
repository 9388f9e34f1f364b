"""Environment confinement: a caller's container Environment / OptimizationEnvironment may
hold only documented options (anything that makes Python or vLLM load code is refused at
Create time), and a model server starts from a minimal environment without a single
setting of the control plane."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from botocore.exceptions import ClientError

from benchmarks.stack import ACCESS_KEY, SECRET_KEY, Stack
from tests.security.conftest import ROLE, SENTINEL, SERVING_ENV, container, error_of, instances

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
