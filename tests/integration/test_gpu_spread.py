"""The instances of one variant over several hosts (workers/serving/spread.py), with the two
workers of tests/integration/test_gpu_hosts.py (host-a: 2 x 24 GiB, host-b: 4 x 24 GiB; one
Postgres database, one Redis broker, vLLM's command line run as a stand-in server).

Its own database and broker db (gpu_spread, Redis 9): both modules run in one session.

Placement asserted (resource -> host -> GPUs), each step with what the one before holds:
- endpoint `pack`, 3 x ml.g5.2xlarge (1 GPU each): one host can hold them all, so one does:
  host-b 0, 1, 2 (host-a would have two only).
- endpoint `too-big`, 4 x ml.g5.2xlarge: host-a 2 free + host-b 1 free = 3 < 4: Failed
  with the capacity error after the wait, nothing held.
- endpoint `spread`, 3 x ml.g5.2xlarge: no host has 3 free, together they do: host-a 0, 1
  and host-b 3, each started by its own host's worker; requests reach all three; a killed
  instance on host-b is restarted on host-b on its GPU; DeleteEndpoint frees every GPU on
  both hosts and leaves no process (host-b's worker stops its own).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from eaglenest.db.session import Database
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation.queue import ENDPOINT_RECOVER_TASK, SERVE_QUEUE, TaskQueue
from tests.integration.test_gpu_hosts import (  # noqa: F401 (pytestmark: its skip)
    CAPACITY,
    WAIT,
    _arn,
    _delete,
    _holdings,
    pytestmark,
    two_hosts,
)
from tests.support.stack import ACCOUNT, Stack, wait_endpoint
from tests.support.workers import Worker

ONE_GPU = "ml.g5.2xlarge"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory, postgres_server, redis_server, tiny_llama_dir
          ) -> Iterator[tuple[Stack, dict[str, Worker]]]:
    with two_hosts(tmp_path_factory, postgres_server, redis_server, tiny_llama_dir,
                   "gpu_spread", 9) as out:
        yield out


def _config(sm: Any, name: str, count: int) -> str:
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "vllm", "InstanceType": ONE_GPU,
        "InitialInstanceCount": count}])
    return name


def _instances(stack: Stack, name: str) -> list[dict]:
    db = Database(stack.extra_env["EAGLENEST_DATABASE_URL"])
    try:
        with db.session() as s:
            row = s.query(EndpointRow).filter_by(name=name, account_id=ACCOUNT).one()
            return [dict(i) for i in row.deployment["Servers"]["AllTraffic"]["instances"]]
    finally:
        db.dispose()


def _placed(stack: Stack, name: str) -> dict[str, list[int]]:
    """Host -> GPUs the endpoint's instances hold, from the database's holdings."""
    out: dict[str, list[int]] = {}
    for host, gpu, holder, *_ in _holdings(stack):
        if holder == _arn("endpoint", name):
            out.setdefault(host, []).append(gpu)
    return {h: sorted(g) for h, g in out.items()}


def _served(inst: dict) -> int:
    """Completions the instance answered (its own counter, behind its secret)."""
    r = httpx.get(f"{inst['url']}/metrics", timeout=10,
                  headers={"Authorization": f"Bearer {inst['secret']}"})
    r.raise_for_status()
    line = next(x for x in r.text.splitlines() if x.startswith("fake_completions_total"))
    return int(line.split()[1])


def _gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_a_variant_no_host_can_hold_is_spread_over_hosts(hosts):
    stack, workers = hosts
    sm, rt = stack.client(), stack.client("sagemaker-runtime")

    # one host can hold all three: they are packed there
    sm.create_endpoint(EndpointName="pack", EndpointConfigName=_config(sm, "pack-3", 3))
    d = wait_endpoint(sm, "pack", ("InService", "Failed"))
    assert d["EndpointStatus"] == "InService", d.get("FailureReason")
    assert _placed(stack, "pack") == {"host-b": [0, 1, 2]}
    assert {i["host"] for i in _instances(stack, "pack")} == {"host-b"}

    # even together the hosts cannot hold four: the capacity error, nothing held
    sm.create_endpoint(EndpointName="too-big", EndpointConfigName=_config(sm, "big-4", 4))
    d = wait_endpoint(sm, "too-big", ("InService", "Failed"), timeout=WAIT + 60)
    assert d["EndpointStatus"] == "Failed"
    assert d["FailureReason"].startswith(CAPACITY) and ONE_GPU in d["FailureReason"]
    assert _placed(stack, "too-big") == {}

    # no host has three free GPUs, together they do: 2 on host-a, 1 on host-b
    sm.create_endpoint(EndpointName="spread", EndpointConfigName=_config(sm, "spread-3", 3))
    d = wait_endpoint(sm, "spread", ("InService", "Failed"))
    assert d["EndpointStatus"] == "InService", d.get("FailureReason")
    assert d["ProductionVariants"][0]["CurrentInstanceCount"] == 3
    assert _placed(stack, "spread") == {"host-a": [0, 1], "host-b": [3]}
    insts = _instances(stack, "spread")
    pairs = [(i["host"], g) for i in insts for g in i["gpus"]]
    assert sorted(pairs) == [("host-a", 0), ("host-a", 1), ("host-b", 3)]
    for inst in insts:  # each process sees the GPU of its own host it holds
        assert psutil.Process(inst["pid"]).environ()["CUDA_VISIBLE_DEVICES"] == str(
            inst["gpus"][0])
    assert len({(h, g) for h, g, *_ in _holdings(stack)}) == len(_holdings(stack))

    # requests reach every instance, wherever it runs
    for _ in range(12):
        r = rt.invoke_endpoint(EndpointName="spread", ContentType="application/json",
                               Body=json.dumps({"prompt": "hi", "max_tokens": 1}))
        assert json.loads(r["Body"].read())["server"] == "spread"
    served = {(i["host"], i["gpus"][0]): _served(i) for i in insts}
    assert all(n > 0 for n in served.values()), served

    # a dead instance on host-b is restarted by host-b's worker, on its own GPU
    (on_b,) = [i for i in insts if i["host"] == "host-b"]
    os.kill(on_b["pid"], signal.SIGKILL)
    TaskQueue(stack.extra_env["EAGLENEST_BROKER_URL"]).send(  # host-a hands it to host-b
        ENDPOINT_RECOVER_TASK, _arn("endpoint", "spread"), f"{SERVE_QUEUE}.host-a")
    deadline = time.monotonic() + 120
    while True:
        now = {i["unit"]: i for i in _instances(stack, "spread")}
        status = sm.describe_endpoint(EndpointName="spread")["EndpointStatus"]
        if now[on_b["unit"]]["pid"] != on_b["pid"] and status == "InService":
            break
        assert time.monotonic() < deadline, (status, now)
        time.sleep(0.5)
    again = now[on_b["unit"]]
    assert again["host"] == "host-b" and again["gpus"] == [3] and not _gone(again["pid"])
    assert {u: i["pid"] for u, i in now.items() if u != on_b["unit"]} == {
        i["unit"]: i["pid"] for i in insts if i is not on_b}  # the others kept serving
    assert _placed(stack, "spread") == {"host-a": [0, 1], "host-b": [3]}

    # DeleteEndpoint: every GPU on both hosts freed, no process left; host-b stopped its own
    pids = [i["pid"] for i in now.values()]
    _delete(sm, "spread")
    assert _placed(stack, "spread") == {}
    assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]
    assert ("stopped 1 instance(s) on host host-b" in workers["host-b"].log_path.read_text()
            or "stopped 2 instance(s) on host host-a" in workers["host-a"].log_path.read_text())
    _delete(sm, "pack", "too-big")
    assert _holdings(stack) == []
