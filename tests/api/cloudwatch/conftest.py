"""CloudWatch's fixtures: boto3 `cloudwatch` clients of two accounts on the test stack
(tests/support/stack.py), each in both protocols the API serves CloudWatch in: "json", the
unchanged client (botocore picks AWS JSON 1.0 from the model's protocols), and "cbor",
botocore's own Smithy RPC v2 CBOR client (the same model listing that protocol alone, as
SDKs that prefer CBOR speak it); and series put straight into the stack's metric store
(db/metrics_repo.py `record`; what the runtime proxy and the workers record is tested with
them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import botocore.loaders
import botocore.session
import pytest
from botocore.config import Config

from eaglenest.db import metrics_repo
from eaglenest.db.metrics_repo import Datum
from eaglenest.db.session import Database
from tests.support.stack import ACCESS_KEY, ACCOUNT, REGION, SECRET_KEY, Stack

ROOT = Path(__file__).resolve().parents[3]
#: the start of the first minute of data: 20 to 30 minutes ago, on a 10-minute boundary
T0 = (int(time.time()) // 600 - 2) * 600
#: per minute from T0: how many invocations the test account made, and the other's
INVOCATIONS = (3, 5, 2)
OTHER_INVOCATIONS = (7,)
#: ModelLatency (microseconds) per minute from T0
LATENCIES = ([1000.0 * k for k in range(1, 11)], [500.0] * 4 + [50000.0])
VARIANT = "AllTraffic"
#: (value, time) of a series whose data lie more than 1,440 minutes apart
SPREAD = ((4.0, T0 - 36 * 3600), (6.0, T0))


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


@dataclass
class Caller:
    """One account's key and its cloudwatch client."""

    account: str
    key: str
    secret: str
    cw: Any


@dataclass
class Series:
    """The series the tests read: one endpoint's, in both accounts."""

    endpoint: str
    dimensions: list[dict[str, str]]


def put(db: Database, account: str, data: list[Datum]) -> None:
    with db.session() as s:
        assert metrics_repo.record(s, account, data, 2000) == len(data)


def sagemaker(endpoint: str, name: str, unit: str, value: float, t: float) -> Datum:
    dims = (("EndpointName", endpoint), ("VariantName", VARIANT))
    return Datum("AWS/SageMaker", name, dims, value, unit, t)


@pytest.fixture(scope="package")
def db(stack: Stack) -> Iterator[Database]:
    database = Database(stack.database_url)
    yield database
    database.dispose()


@pytest.fixture(scope="package")
def cbor_data_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A botocore data path whose cloudwatch model lists smithy-rpc-v2-cbor alone."""
    raw = botocore.loaders.Loader().load_service_model("cloudwatch", "service-2")
    assert "smithy-rpc-v2-cbor" in raw["metadata"]["protocols"]
    raw["metadata"]["protocols"] = ["smithy-rpc-v2-cbor"]
    folder = tmp_path_factory.mktemp("botocore-cbor")
    where = folder / "cloudwatch" / raw["metadata"]["apiVersion"]
    where.mkdir(parents=True)
    (where / "service-2.json").write_text(json.dumps(raw))
    return folder


def served_as_json() -> None:
    """Fail clearly while CloudWatch is not among the JSON services of `POST /`."""
    from eaglenest.api.cloudwatch import SERVICE
    from eaglenest.api.edge import json_protocol

    assert any(s is SERVICE for s in json_protocol.SERVICES), (
        "api/edge/json_protocol.py must list cloudwatch.SERVICE in SERVICES: boto3 and the "
        "AWS CLI speak AWS JSON 1.0 to CloudWatch")


def client(stack: Stack, protocol: str, data_path: Path, key: str = ACCESS_KEY,
           secret: str = SECRET_KEY) -> Any:
    """A cloudwatch client speaking `protocol` ("json": boto3's own choice, or "cbor")."""
    core = botocore.session.get_session()
    if protocol == "cbor":
        core.set_config_variable("data_path", str(data_path))
    else:
        served_as_json()
    made = boto3.session.Session(botocore_session=core).client(
        "cloudwatch", endpoint_url=stack.url, region_name=REGION, aws_access_key_id=key,
        aws_secret_access_key=secret, config=Config(retries={"total_max_attempts": 1}))
    assert made.meta.service_model.resolved_protocol == (
        "smithy-rpc-v2-cbor" if protocol == "cbor" else "json")
    return made


@pytest.fixture(scope="package", params=["json", "cbor"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="package")
def cw(stack: Stack, protocol: str, cbor_data_path: Path) -> Any:
    return client(stack, protocol, cbor_data_path)


@pytest.fixture(scope="package")
def account(stack: Stack) -> tuple[str, str, str]:
    """(account id, key id, secret) of a new account (`eaglenest keys create
    --new-account`)."""
    env = {**os.environ, "EAGLENEST_DATA_DIR": str(stack.data_dir)}
    r = subprocess.run([sys.executable, "-m", "eaglenest.cli", "keys", "create", "--name",
                        "cloudwatch-other", "--new-account"], env=env, capture_output=True,
                       text=True, cwd=ROOT, check=False, timeout=60)
    assert r.returncode == 0, r.stderr
    out = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    assert out["account"] != ACCOUNT
    return out["account"], out["access key id"], out["secret access key"]


@pytest.fixture(scope="package")
def other(stack: Stack, account: tuple[str, str, str], protocol: str, cbor_data_path: Path
          ) -> Caller:
    """The other account's key and client, in the protocol of `cw`."""
    number, key, secret = account
    return Caller(number, key, secret, client(stack, protocol, cbor_data_path, key, secret))


@pytest.fixture(scope="package")
def series(db: Database, account: tuple[str, str, str]) -> Series:
    """INVOCATIONS, LATENCIES and SPREAD of one endpoint in the test account,
    OTHER_INVOCATIONS of the same endpoint name in the other account, and a job's loss in the
    test account."""
    endpoint = f"cw-{int(time.time() * 1000) % 10**8}"
    data = [sagemaker(endpoint, "Invocations", "Count", 1.0, T0 + 60 * m + j)
            for m, n in enumerate(INVOCATIONS) for j in range(n)]
    data += [sagemaker(endpoint, "ModelLatency", "Microseconds", v, T0 + 60 * m + 30)
             for m, values in enumerate(LATENCIES) for v in values]
    data += [sagemaker(endpoint, "Spread", "Count", v, t) for v, t in SPREAD]
    data.append(Datum("EagleNest/OptimizationJobs", "TrainingLoss",
                      (("OptimizationJobName", endpoint),), 2.5, "None", T0))
    put(db, ACCOUNT, data)
    put(db, account[0], [sagemaker(endpoint, "Invocations", "Count", 1.0, T0 + j)
                            for j in range(OTHER_INVOCATIONS[0])])
    return Series(endpoint, [{"Name": "EndpointName", "Value": endpoint},
                             {"Name": "VariantName", "Value": VARIANT}])


def error(exc: pytest.ExceptionInfo[Any]) -> tuple[str, str, int]:
    e = exc.value.response
    return e["Error"]["Code"], e["Error"]["Message"], e["ResponseMetadata"]["HTTPStatusCode"]
