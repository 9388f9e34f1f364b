"""The broker goes away (issue #22): /ping stays 200 and says so, /metrics reports
`eaglenest_broker_up 0`, CreateOptimizationJob and CreateEndpoint still succeed (the rows
are the truth), and once the broker is back, empty, the running worker dispatches both
within seconds: no worker restart, no lease to wait out."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from eaglenest.workers.infra.broker import redis_server_binary
from tests.reliability.reliability_helpers import (
    endpoint_status,
    job_args,
    job_status,
    make_endpoint,
    serving_env,
)
from tests.support.stack import ACCOUNT, REGION, Stack, free_port, wait_for


class Broker:
    """A redis-server without persistence on a fixed port: it comes back empty."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [str(redis_server_binary()), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        wait_for(lambda: self._pings(), 15, "redis did not start")

    def _pings(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture
def broker() -> Iterator[Broker]:
    b = Broker()
    b.start()
    yield b
    b.stop()


def _health(stack: Stack) -> tuple[int, dict, int]:
    ping = httpx.get(f"{stack.url}/ping", timeout=10)
    metrics = httpx.get(f"{stack.url}/metrics", timeout=10).text
    (up,) = [int(float(line.split()[1])) for line in metrics.splitlines()
             if line.startswith("eaglenest_broker_up ")]
    return ping.status_code, ping.json(), up


def test_calls_made_while_the_broker_is_down_run_within_seconds_of_its_return(
        tmp_path, broker: Broker) -> None:
    # a lease far longer than the test: only the broker's return can dispatch the calls
    stack = Stack(tmp_path, extra_env={"EAGLENEST_BROKER_URL": broker.url,
                                       "EAGLENEST_JOB_LEASE_SECONDS": "600"}).start()
    try:
        sm = stack.client()
        wait_for(lambda: "ready" in stack.log(), 60, "the worker never got ready", stack)
        assert _health(stack) == (200, {"status": "ok", "broker": "up"}, 1)
        broker.stop()
        time.sleep(1.5)  # the API's probe result lives a second
        assert _health(stack) == (200, {"status": "degraded", "broker": "down"}, 0)
        sm.create_optimization_job(OptimizationJobName="while-down",
                                   **job_args("s3://models/missing/"))
        make_endpoint(sm, "while-down", "s3://models/missing/", serving_env())
        assert job_status(sm, "while-down")["OptimizationJobStatus"] == "STARTING"
        assert endpoint_status(sm, "while-down")["EndpointStatus"] == "Creating"
        assert ("could not publish eaglenest.endpoint.create(arn:aws:sagemaker:"
                f"{REGION}:{ACCOUNT}:endpoint/while-down)") in stack.log()
        broker.start()  # empty: both messages are gone
        back = time.monotonic()
        wait_for(lambda: job_status(sm, "while-down")["OptimizationJobStatus"] == "FAILED"
                 and endpoint_status(sm, "while-down")["EndpointStatus"] == "Failed",
                 60, "the calls were not dispatched after the broker's return", stack)
        took = time.monotonic() - back
        assert took < 15, took  # measured: 3.3 s (the watchdog pings the broker every second)
        assert job_status(sm, "while-down")["FailureReason"] == \
            "nothing found at s3://models/missing/"
        assert "nothing found at s3://models/missing/" in \
            endpoint_status(sm, "while-down")["FailureReason"]
        assert "the broker answers again: re-sent 1 jobs and 1 endpoints" in stack.log()
        assert _health(stack) == (200, {"status": "ok", "broker": "up"}, 1)
    finally:
        stack.stop()
