"""Blue/green plans and checks (db/traffic_policy.py)."""

from __future__ import annotations

import pytest

from eaglenest.db.traffic_policy import check, plan
from eaglenest.foundation.errors import ValidationException


def bg(kind: str, wait: int = 10, term: int | None = None, max_s: int | None = None,
       **sizes: dict) -> dict:
    policy: dict = {"TrafficRoutingConfiguration": {"Type": kind, "WaitIntervalInSeconds": wait,
                                                    **sizes}}
    if term is not None:
        policy["TerminationWaitInSeconds"] = term
    if max_s is not None:
        policy["MaximumExecutionTimeoutInSeconds"] = max_s
    return {"BlueGreenUpdatePolicy": policy}


def size(kind: str, value: int) -> dict:
    return {"Type": kind, "Value": value}


@pytest.mark.parametrize(("config", "instances", "steps"), [
    (None, 1, [(1.0, 0.0)]),
    ({"AutoRollbackConfiguration": {}}, 1, [(1.0, 0.0)]),
    (bg("ALL_AT_ONCE", 5, term=3), 2, [(1.0, 8.0)]),
    (bg("CANARY", 10, CanarySize=size("CAPACITY_PERCENT", 25)), 1, [(0.25, 10.0), (1.0, 10.0)]),
    (bg("CANARY", 4, term=6, CanarySize=size("INSTANCE_COUNT", 1)), 4,
     [(0.25, 4.0), (1.0, 10.0)]),
    (bg("LINEAR", 2, LinearStepSize=size("CAPACITY_PERCENT", 30)), 1,
     [(0.3, 2.0), (0.6, 2.0), (0.9, 2.0), (1.0, 2.0)]),
    (bg("LINEAR", 1, LinearStepSize=size("INSTANCE_COUNT", 1)), 2, [(0.5, 1.0), (1.0, 1.0)]),
])
def test_plan_steps(config, instances, steps):
    check(config, instances)
    assert plan(config, instances).steps == steps


def test_plan_bounds():
    p = plan({**bg("ALL_AT_ONCE", 0, max_s=600), "AutoRollbackConfiguration": {}}, 1)
    assert (p.max_seconds, p.auto_rollback, p.steps) == (600.0, True, [(1.0, 0.0)])
    assert plan(bg("ALL_AT_ONCE", 1), 1).steps == [(1.0, 1.0)]
    assert plan(None, 3).steps == [(1.0, 0.0)]


@pytest.mark.parametrize(("config", "instances", "message"), [
    (bg("CANARY"), 2, "TrafficRoutingConfiguration.CanarySize must be specified when Type is "
                      "CANARY."),
    (bg("LINEAR", CanarySize=size("INSTANCE_COUNT", 1)), 2,
     "TrafficRoutingConfiguration.CanarySize can be specified only when Type is CANARY "
     "(Type is LINEAR)."),
    (bg("CANARY", CanarySize=size("INSTANCE_COUNT", 2)), 3,
     "TrafficRoutingConfiguration.CanarySize Value 2 instance(s) is 67% of the new fleet "
     "(3 instance(s)); it must be at most 50% of it."),
    (bg("CANARY", CanarySize=size("CAPACITY_PERCENT", 51)), 1, "must be at most 50%"),
    (bg("LINEAR", LinearStepSize=size("CAPACITY_PERCENT", 5)), 1,
     "TrafficRoutingConfiguration.LinearStepSize Value 5% is 5% of the new fleet "
     "(1 instance(s)); it must be 10%-50% of it."),
    (bg("LINEAR", LinearStepSize=size("INSTANCE_COUNT", 3)), 4, "must be 10%-50% of it"),
    (bg("LINEAR", 300, term=100, max_s=700, LinearStepSize=size("CAPACITY_PERCENT", 50)), 1,
     "BlueGreenUpdatePolicy.MaximumExecutionTimeoutInSeconds (700) must be larger than the "
     "total waiting time of the deployment (700 s of WaitIntervalInSeconds per step and "
     "TerminationWaitInSeconds)."),
    ({**bg("ALL_AT_ONCE"), "RollingUpdatePolicy": {}}, 1,
     "DeploymentConfig: specify only one of BlueGreenUpdatePolicy and RollingUpdatePolicy."),
])
def test_check_rejects(config, instances, message):
    with pytest.raises(ValidationException) as exc:
        check(config, instances)
    assert message in str(exc.value)
