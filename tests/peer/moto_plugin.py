"""pytest plugin for moto's own SageMaker tests run in moto's server mode against EagleNest
(scripts/peer_suite.sh). It does three things, and nothing else:

1. Deselects the tests tests/peer/moto_excluded.txt marks `excluded` (each with the AWS
   behaviour it contradicts) and reports how many ran, passed and were excluded.
2. Stands in for moto's reset API (`POST /moto-api/reset`, which EagleNest does not serve;
   MOTO_CALL_RESET_API=false): before each test every model, endpoint config, endpoint,
   optimization job is deleted through the public SageMaker API.
3. Applies, to the tests the list marks `adjusted` and only while they run, the
   adjustments it names (explained in the list's header): arn-case (the test's `re.match`
   ignores case) and model-request (CreateModel gets a container and an IAM role ARN).
"""

from __future__ import annotations

import os
import re
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import boto3.session
import pytest

LIST = Path(__file__).with_name("moto_excluded.txt")
ENDPOINT = os.environ.get("TEST_SERVER_MODE_ENDPOINT", "")
IAM_ROLE = re.compile(r"arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+")
ADJUST_ROLE = "arn:aws:iam::123456789012:role/PeerSuiteRole"
ADJUST_IMAGE = "382416733822.dkr.ecr.us-east-1.amazonaws.com/peer-suite:1"


ADJUSTMENTS = ("arn-case", "model-request")


def read_list() -> dict[str, tuple[str, set[str]]]:
    """test id (file::name) -> (excluded | adjusted, its adjustments)."""
    out = {}
    for line in LIST.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        test, kind, adjust, _reason = (part.strip() for part in line.split("|", 3))
        names = {a.strip() for a in adjust.split(",")} - {"-"}
        if kind not in ("excluded", "adjusted") or (kind == "adjusted") != bool(names) \
                or names - set(ADJUSTMENTS):
            raise ValueError(f"{LIST.name}: {test}: malformed entry")
        out[test] = (kind, names)
    return out


ENTRIES = read_list()


_active: set[str] = set()  # the running test's adjustments


def _fix_create_model(params: dict[str, Any], **_: Any) -> None:
    if "model-request" not in _active:
        return
    if "PrimaryContainer" not in params and "Containers" not in params:
        params["PrimaryContainer"] = {"Image": ADJUST_IMAGE}
    if not IAM_ROLE.fullmatch(params.get("ExecutionRoleArn", "")):
        params["ExecutionRoleArn"] = ADJUST_ROLE


_real_client = boto3.session.Session.client


def _client(self: boto3.session.Session, *args: Any, **kwargs: Any) -> Any:
    client = _real_client(self, *args, **kwargs)
    client.meta.events.register("before-parameter-build.sagemaker.CreateModel",
                                _fix_create_model)
    return client


def _ignore_case() -> types.SimpleNamespace:
    shim = types.SimpleNamespace(**{k: getattr(re, k) for k in dir(re) if not k.startswith("_")})
    shim.match = lambda pattern, text, flags=0: re.match(pattern, text, flags | re.IGNORECASE)
    return shim


def pytest_configure(config: pytest.Config) -> None:
    boto3.session.Session.client = _client  # type: ignore[method-assign]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    known = {f"{Path(item.fspath).name}::{item.name}" for item in items}
    unknown = sorted(set(ENTRIES) - known)
    if unknown:
        raise pytest.UsageError(f"{LIST.name} names tests moto does not have: {unknown}")
    keep, drop = [], []
    for item in items:
        kind = ENTRIES.get(f"{Path(item.fspath).name}::{item.name}", ("", set()))[0]
        (drop if kind == "excluded" else keep).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
    config.stash[_COUNTS] = {"excluded": len(drop),
                             "adjusted": sum(1 for k, _ in ENTRIES.values() if k == "adjusted")}


_COUNTS = pytest.StashKey[dict[str, int]]()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    counts = config.stash.get(_COUNTS, {})
    passed = len(terminalreporter.stats.get("passed", []))
    terminalreporter.write_line(
        f"peer suite: {passed} passed, {counts.get('excluded', 0)} excluded as moto-only "
        f"({counts.get('adjusted', 0)} of the run ones adjusted), see {LIST}")


def _empty_eaglenest() -> None:
    sm = _real_client(boto3.session.Session(), "sagemaker", region_name="us-east-1",
                      endpoint_url=ENDPOINT)
    for e in sm.list_endpoints(MaxResults=100)["Endpoints"]:
        sm.delete_endpoint(EndpointName=e["EndpointName"])
    deadline = time.monotonic() + 60
    while sm.list_endpoints(MaxResults=100)["Endpoints"]:
        assert time.monotonic() < deadline, "endpoints still deleting after 60 s"
        time.sleep(0.2)
    for c in sm.list_endpoint_configs(MaxResults=100)["EndpointConfigs"]:
        sm.delete_endpoint_config(EndpointConfigName=c["EndpointConfigName"])
    for m in sm.list_models(MaxResults=100)["Models"]:
        sm.delete_model(ModelName=m["ModelName"])
    for j in sm.list_optimization_jobs(MaxResults=100)["OptimizationJobSummaries"]:
        sm.delete_optimization_job(OptimizationJobName=j["OptimizationJobName"])


@pytest.fixture(autouse=True)
def _reset_and_adjust(request: pytest.FixtureRequest,
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    _empty_eaglenest()
    test = f"{Path(request.node.fspath).name}::{request.node.name}"
    adjustments = ENTRIES.get(test, ("", set()))[1]
    if "arn-case" in adjustments:
        monkeypatch.setattr(request.module, "re", _ignore_case())
    _active.clear()
    _active.update(adjustments)
    yield
    _active.clear()
