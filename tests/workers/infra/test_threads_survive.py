"""The worker's long-running threads survive whatever one round raises (issue #35): the
watchdog, a job's heartbeat and an endpoint's lease heartbeat log it and go on at their
pace (foundation/host/loops.py). SystemExit stands for what an `except Exception` lets through."""

from __future__ import annotations

import contextlib
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from eaglenest.db import endpoints_repo as eps
from eaglenest.db import optimization_jobs_repo as jobs
from eaglenest.workers.infra import reconcile
from eaglenest.workers.jobs.control import JobControl
from eaglenest.workers.serving.endpoint_lease import EndpointLease

JOB = "arn:aws:sagemaker:us-east-1:123456789012:optimization-job/j"
ENDPOINT = "arn:aws:sagemaker:us-east-1:123456789012:endpoint/e"


def context(lease: float) -> Any:
    return SimpleNamespace(lease_seconds=lease, owner="w-1", shutting_down=threading.Event(),
                           db=SimpleNamespace(session=contextlib.nullcontext))


def flaky(calls: list[float], error: BaseException, result: Any = None) -> Any:
    """A function that records each call and raises `error` on the second."""
    def fn(*_: Any) -> Any:
        calls.append(time.monotonic())
        if len(calls) == 2:
            raise error
        return result
    return fn


def wait_for(calls: list[float], n: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while len(calls) < n:
        assert time.monotonic() < deadline, f"{len(calls)} calls, not {n}"
        time.sleep(0.01)


def test_the_watchdog_survives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconcile, "BROKER_POLL_SECONDS", 0.02)
    ctx = context(3600)
    calls: list[float] = []
    ctx.queue = SimpleNamespace(broker_up=flaky(calls, SystemExit(1), True))
    thread = reconcile.start_watchdog(ctx)
    try:
        wait_for(calls, 5)
        assert thread.is_alive()
    finally:
        ctx.shutting_down.set()
        thread.join(5)


def test_a_job_heartbeat_survives(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    monkeypatch.setattr(jobs, "heartbeat", flaky(calls, SystemExit(1), jobs.STOPPING))
    control = JobControl(context(3600), JOB, None, time.time(), interval=0.02)
    with control:
        wait_for(calls, 4)
    assert control.reason == "stopped"  # beats after the failed one still count


def test_an_endpoint_lease_heartbeat_survives(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    monkeypatch.setattr(eps, "claim", lambda *_: True)
    monkeypatch.setattr(eps, "release", lambda *_: None)
    monkeypatch.setattr(eps, "heartbeat", flaky(calls, SystemExit(1)))
    with EndpointLease(context(0.06), ENDPOINT, "Creating") as lease:
        assert lease.held
        wait_for(calls, 4)
        # never slower than a third of the lease, failed beat included
        assert max(b - a for a, b in zip(calls, calls[1:], strict=False)) < 0.06 + 0.05
