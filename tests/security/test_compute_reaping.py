"""A host's compute budget is given back when a fleet is deleted: the worker reaps the model
servers it stops (no zombie is left behind it) and the ledger of compute processes counts
live processes only, so one account that runs the whole budget and deletes its endpoint
does not lock every other account out (issue #51)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.conftest import ROLE, container, deploy, new_account
from tests.support.jobs import upload
from tests.support.processes import zombies_of
from tests.support.stack import Stack

BUDGET = 2


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[Stack]:
    """A serve worker on a host that runs at most BUDGET compute processes, counted in a
    ledger of the stack's own (not the other stacks' of the suite)."""
    data_dir = tmp_path_factory.mktemp("compute-reaping")
    s = Stack(data_dir, extra_env={
        "EAGLENEST_WORKER_QUEUES": "serve", "EAGLENEST_MAX_COMPUTE_PROCESSES": str(BUDGET),
        "EAGLENEST_COMPUTE_REGISTRY": str(data_dir / "compute")}).start()
    upload(s, tiny_llama_dir, "s3://models/tiny/")
    yield s
    s.stop()


def worker_pid(stack: Stack) -> int:
    """The stack's worker process (`up` records its children in <data-dir>/up/)."""
    for path in (stack.data_dir / "up").glob("*.json"):
        record = json.loads(path.read_text())
        if record["role"] == "up-worker":
            return int(record["pid"])
    raise AssertionError("the stack has no worker")



def wait_status(sm, name: str, timeout: float = 240) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while (d := sm.describe_endpoint(EndpointName=name))["EndpointStatus"] == "Creating":
        assert time.monotonic() < deadline, d
        time.sleep(0.5)
    return d


def test_a_deleted_fleet_gives_its_compute_budget_back(budgeted: Stack,
                                                      tiny_llama_dir: Path) -> None:
    from eaglenest.foundation.host.threads import ComputeLedger

    ledger, worker = ComputeLedger(budgeted.data_dir / "compute"), worker_pid(budgeted)
    sm = budgeted.client()
    sm.create_model(ModelName="all-of-it", ExecutionRoleArn=ROLE, PrimaryContainer=container())
    deploy(sm, "all-of-it", "all-of-it", count=BUDGET)  # the whole host's budget
    assert wait_status(sm, "all-of-it")["EndpointStatus"] == "InService"
    assert ledger.running() == BUDGET
    sm.delete_endpoint(EndpointName="all-of-it")
    deadline = time.monotonic() + 60
    while [e for e in sm.list_endpoints()["Endpoints"] if e["EndpointName"] == "all-of-it"]:
        assert time.monotonic() < deadline, "the endpoint was not deleted"
        time.sleep(0.2)
    assert zombies_of(worker) == []  # the worker waited for the servers it stopped
    assert ledger.running() == 0

    other = new_account(budgeted, "other")
    upload(budgeted, tiny_llama_dir, "s3://other-models/tiny/", account=other.account)
    other.sm.create_model(ModelName="mine", ExecutionRoleArn=ROLE,
                          PrimaryContainer=container(uri="s3://other-models/tiny/"))
    deploy(other.sm, "mine", "mine")
    d = wait_status(other.sm, "mine")
    assert d["EndpointStatus"] == "InService", d.get("FailureReason")

