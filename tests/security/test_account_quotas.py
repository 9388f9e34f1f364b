"""Per-account quotas on what an account holds and keeps (issue #51, part 4): the GPUs of
its endpoints and jobs not yet ended, the models, endpoint configurations and optimization
jobs it keeps, and the size of a CreateModel's Environment. The API in this process
(tests/security/asgi_api.py): endpoints stay Creating and jobs STARTING, holding their
quota, and no worker runs."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from eaglenest.foundation.settings import Settings
from eaglenest.foundation.store.storage import make_store
from tests.security.asgi_api import InProcessApi

ALICE, BOB = "111111111111", "222222222222"
KEYS = {ALICE: ("AKIAALICE00000000001", "alice-secret"),
        BOB: ("AKIABOB0000000000001", "bob-secret")}
ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"


def make_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> InProcessApi:
    """Default quotas but for `env`; alice's and bob's keys."""
    for name in list(os.environ):
        if name.startswith("EAGLENEST_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    data = tmp_path / "data"
    data.mkdir()
    (data / "credentials").write_text("".join(
        f"[{acct}]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"
        f"eaglenest_account_id = {acct}\n" for acct, (key, secret) in KEYS.items()))
    api = InProcessApi(data)
    store = make_store(api.settings)
    for account in KEYS:
        store.claim(f"models-{account}", account)
    return api


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> InProcessApi:
    return make_api(tmp_path, monkeypatch)


def call(api: InProcessApi, op: str, body: dict[str, Any], account: str = ALICE) -> Any:
    return api.call(op, body, *KEYS[account])


def ok(api: InProcessApi, op: str, body: dict[str, Any], account: str = ALICE) -> Any:
    r = call(api, op, body, account)
    assert r.status_code == 200, r.text
    return r.json()


def refused(api: InProcessApi, op: str, body: dict[str, Any], account: str = ALICE,
            code: str = "ResourceLimitExceeded") -> str:
    r = call(api, op, body, account)
    assert r.status_code == 400, r.text
    assert r.json()["__type"] == code, r.text
    return str(r.json()["message"])


def model(name: str, env: dict[str, str] | None = None, containers: int = 0
          ) -> dict[str, Any]:
    container = {"Image": "eaglenest", "Environment": env or {}}
    body: dict[str, Any] = {"ModelName": name, "ExecutionRoleArn": ROLE}
    if containers:
        body["Containers"] = [container] * containers
    else:
        body["PrimaryContainer"] = container
    return body


def config(name: str, itype: str, count: int = 1) -> dict[str, Any]:
    return {"EndpointConfigName": name, "ProductionVariants": [{
        "VariantName": "v", "ModelName": "m", "InstanceType": itype,
        "InitialInstanceCount": count}]}


def job(name: str, itype: str = "ml.g5.xlarge", account: str = ALICE,
        **env: str) -> dict[str, Any]:
    return {"OptimizationJobName": name, "RoleArn": ROLE,
            "ModelSource": {"S3": {"S3Uri": f"s3://models-{account}/tiny/"}},
            "DeploymentInstanceType": itype, "OptimizationEnvironment": env,
            "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
            "OutputConfig": {"S3OutputLocation": f"s3://models-{account}/out/"},
            "StoppingCondition": {"MaxRuntimeInSeconds": 60}}


def test_the_defaults_suit_a_shared_team_host() -> None:
    s = Settings()
    assert (s.max_gpus, s.max_models, s.max_endpoint_configs, s.max_optimization_jobs) == \
        (8, 100, 100, 100)
    assert Settings(max_gpus="unlimited").max_gpus is None  # only when the operator says so
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        Settings(max_gpus=-1)


def test_gpus_held_across_endpoints_and_jobs(api: InProcessApi) -> None:
    """The finding: quotas counted instances, so 16 x ml.p5.48xlarge (128 GPUs) passed.
    One account now holds at most EAGLENEST_MAX_GPUS (8) GPUs; another is not affected."""
    for account in (ALICE, BOB):
        ok(api, "CreateModel", model("m"), account)
        ok(api, "CreateEndpointConfig", config("p5", "ml.p5.48xlarge"), account)
        ok(api, "CreateEndpointConfig", config("g5", "ml.g5.xlarge"), account)
        ok(api, "CreateEndpointConfig", config("cpu", "ml.m5.xlarge"), account)
    ok(api, "CreateEndpoint", {"EndpointName": "e1", "EndpointConfigName": "p5"})
    message = refused(api, "CreateEndpoint", {"EndpointName": "e2", "EndpointConfigName": "p5"})
    assert message.startswith(
        "The account-level service limit 'GPUs across all endpoints and optimization jobs' "
        "is 8 GPUs, with current utilization of 8 GPUs and a request delta of 8 GPUs. Ask "
        "the operator to raise EAGLENEST_MAX_GPUS.")
    refused(api, "CreateEndpoint", {"EndpointName": "e3", "EndpointConfigName": "g5"})
    message = refused(api, "CreateOptimizationJob", job("j1"))
    assert "current utilization of 8 GPUs and a request delta of 1 GPUs" in message
    ok(api, "CreateEndpoint", {"EndpointName": "c1", "EndpointConfigName": "cpu"})  # no GPU
    ok(api, "CreateEndpoint", {"EndpointName": "e1", "EndpointConfigName": "p5"}, BOB)
    ok(api, "DeleteEndpoint", {"EndpointName": "e1"})  # never deployed: gone at once
    ok(api, "CreateOptimizationJob", job("j1"))
    ok(api, "CreateEndpoint", {"EndpointName": "e3", "EndpointConfigName": "g5"})
    ok(api, "CreateEndpointConfig", config("g5x4", "ml.g5.xlarge", 4))
    ok(api, "CreateEndpointConfig", config("g5-12x2", "ml.g5.12xlarge", 2))
    ok(api, "CreateEndpoint", {"EndpointName": "e4", "EndpointConfigName": "g5x4"})
    message = refused(api, "CreateEndpoint", {"EndpointName": "e5",
                                              "EndpointConfigName": "g5-12x2"})
    assert "current utilization of 6 GPUs and a request delta of 8 GPUs" in message
    listed = ok(api, "ListEndpoints", {})["Endpoints"]
    assert sorted(e["EndpointName"] for e in listed) == ["c1", "e3", "e4"]


def test_gpu_quota_counts_a_jobs_instance_type(api: InProcessApi) -> None:
    ok(api, "CreateOptimizationJob", job("big", "ml.p4d.24xlarge"))
    message = refused(api, "CreateOptimizationJob", job("small", "ml.g5.xlarge"))
    assert "'GPUs across all endpoints and optimization jobs' is 8 GPUs, with current " \
        "utilization of 8 GPUs and a request delta of 1 GPUs" in message
    ok(api, "StopOptimizationJob", {"OptimizationJobName": "big"})  # STOPPED: holds none
    ok(api, "CreateOptimizationJob", job("small", "ml.g5.xlarge"))


@pytest.mark.parametrize(("setting", "op", "unit", "quota"), [
    ("EAGLENEST_MAX_MODELS", "CreateModel", "Models", "models"),
    ("EAGLENEST_MAX_ENDPOINT_CONFIGS", "CreateEndpointConfig", "EndpointConfigs",
     "endpoint configurations"),
    ("EAGLENEST_MAX_OPTIMIZATION_JOBS", "CreateOptimizationJob", "Jobs", "optimization jobs"),
])
def test_resources_kept_per_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    setting: str, op: str, unit: str, quota: str) -> None:
    """Before: no limit on how many models, configs or jobs an account keeps."""
    kept = make_api(tmp_path, monkeypatch, **{setting: "2"})
    for account in KEYS:
        ok(kept, "CreateModel", model("m"), account)

    def body(i: int, account: str = ALICE) -> dict[str, Any]:
        if op == "CreateModel":
            return model(f"m{i}")
        if op == "CreateEndpointConfig":
            return config(f"c{i}", "ml.m5.xlarge")
        return job(f"j{i}", "ml.g5.xlarge", account)

    first = 1 if op == "CreateModel" else 0  # `m` is one model already
    for i in range(first, 2):
        ok(kept, op, body(i))
    message = refused(kept, op, body(2))
    assert message == (f"The account-level service limit '{quota}' is 2 {unit}, with current "
                       f"utilization of 2 {unit} and a request delta of 1 {unit}. Ask the "
                       f"operator to raise {setting}.")
    ok(kept, op, body(1, BOB), BOB)  # per account
    if op == "CreateOptimizationJob":  # a job ended is still kept until it is deleted
        ok(kept, "StopOptimizationJob", {"OptimizationJobName": "j0"})
        refused(kept, op, body(2))
        ok(kept, "DeleteOptimizationJob", {"OptimizationJobName": "j0"})
        ok(kept, op, body(2))


def test_a_models_environment_is_bounded_as_sagemaker_bounds_it(api: InProcessApi) -> None:
    """Before: 15 containers x 100 entries of 1 KiB keys and values, 3 MB a model, each
    stored; SageMaker allows 32 KB for all of a CreateModel's Environment maps."""
    huge = {f"K{i:03d}" + "x" * 1020: "v" * 1024 for i in range(100)}
    message = refused(api, "CreateModel", model("huge", huge, containers=15),
                      code="ValidationException")
    assert "total 3072000 bytes; at most 32768 (32 KB)" in message
    assert message.startswith("Containers.1.Environment, Containers.2.Environment")
    split = {f"K{i:02d}": "v" * 1000 for i in range(17)}  # 17 x 1003 bytes: 17051
    message = refused(api, "CreateModel", model("split", split, containers=2),
                      code="ValidationException")
    assert "total 34102 bytes" in message
    ok(api, "CreateModel", model("fits", split))
    with sqlite3.connect(api.settings.data_dir / "eaglenest.db") as db:
        assert db.execute("SELECT name FROM models").fetchall() == [("fits",)]
