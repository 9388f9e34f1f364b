"""The security suite's stack: a real `eaglenest up` (API, serve worker, embedded broker)
with the tiny Llama target in its store and, once per session, one endpoint serving it.
Each test performs an attack through boto3 or raw HTTP and checks it fails safely."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.jobs import ROOT, upload
from tests.support.stack import ACCOUNT, Stack

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"
#: set in the worker's environment only: a model server that sees it got the worker's own
SENTINEL = ("EAGLENEST_SECURITY_SENTINEL", "the-worker-environment")
SERVING_ENV = {"EAGLENEST_SERVING_BACKEND": "embedded", "EAGLENEST_MAX_MODEL_LEN": "256",
               "OMP_NUM_THREADS": "1"}
ENDPOINT = "sec-ep"


def container(env: dict[str, str] | None = None, uri: str = "s3://models/tiny/") -> dict:
    return {"Image": "eaglenest", "Environment": env if env is not None else SERVING_ENV,
            "ModelDataSource": {"S3DataSource": {"S3Uri": uri, "S3DataType": "S3Prefix",
                                                 "CompressionType": "None"}}}


def deploy(sm: Any, name: str, model: str, count: int = 1) -> None:
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": model, "InstanceType": "ml.g5.2xlarge",
        "InitialInstanceCount": count, "ContainerStartupHealthCheckTimeoutInSeconds": 120}])
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)


@pytest.fixture(scope="session")
def secure(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("secure"), extra_env={
        "EAGLENEST_WORKER_QUEUES": "serve", SENTINEL[0]: SENTINEL[1]}).start()
    upload(s, tiny_llama_dir, "s3://models/tiny/")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def served(secure: Stack) -> str:
    """The name of an InService endpoint of the stack (one instance of the tiny target)."""
    sm = secure.client()
    sm.create_model(ModelName=ENDPOINT, ExecutionRoleArn=ROLE, PrimaryContainer=container())
    deploy(sm, ENDPOINT, ENDPOINT)
    sm.get_waiter("endpoint_in_service").wait(
        EndpointName=ENDPOINT, WaiterConfig={"Delay": 1, "MaxAttempts": 240})
    return ENDPOINT


def instances(stack: Stack, endpoint: str) -> list[dict[str, Any]]:
    from eaglenest.foundation.deployment import instances_of

    servers = stack.deployment(endpoint)["Servers"]
    return [i for record in servers.values() for i in instances_of(record)]


def error_of(exc_info: pytest.ExceptionInfo[Any]) -> tuple[str, str]:
    err = exc_info.value.response["Error"]
    return err["Code"], err["Message"]


def keys_cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EAGLENEST_DATA_DIR": str(stack.data_dir)}
    return subprocess.run([sys.executable, "-m", "eaglenest.cli", "keys", *args],
                          env=env, capture_output=True, text=True, cwd=ROOT, check=False)


class Caller:
    """One account's clients."""

    def __init__(self, stack: Stack, account: str, **creds: str) -> None:
        self.account = account
        self.sm = stack.client(**creds)
        self.rt = stack.client("sagemaker-runtime", **creds)
        self.tagging = stack.client("resourcegroupstaggingapi", **creds)


def new_account(stack: Stack, name: str) -> Caller:
    """A key of a new account (`eaglenest keys create --new-account`) and its clients."""
    r = keys_cli(stack, "create", "--name", name, "--new-account")
    assert r.returncode == 0, r.stderr
    out = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    caller = Caller(stack, out["account"], key=out["access key id"],
                    secret=out["secret access key"])
    assert caller.account != ACCOUNT and len(caller.account) == 12 and caller.account.isdigit()
    return caller
