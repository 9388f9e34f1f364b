"""Blue/green traffic shifting (DeploymentConfig.BlueGreenUpdatePolicy of UpdateEndpoint): the
checks of a policy against the new fleet, and the steps a serve worker runs (pure functions).

The new fleet starts beside the old one; then each step sends a fraction of the traffic to
it and waits WaitIntervalInSeconds (the baking period): ALL_AT_ONCE is one step of 100%,
CANARY a step of CanarySize then one of 100%, LINEAR steps of LinearStepSize up to 100%.
After the last step TerminationWaitInSeconds more pass before the old fleet stops; the
endpoint is Updating throughout. A size is a share of the new fleet's capacity:
INSTANCE_COUNT Value / the fleet's instance count (all its variants), CAPACITY_PERCENT
Value %. The router sends that share of requests to the new fleet (EagleNest routes by
request, so a percentage need not be a whole number of instances).

MaximumExecutionTimeoutInSeconds bounds the whole shift (exceeded: rolled back). With
AutoRollbackConfiguration the new fleet's health is checked throughout the baking periods and
a failed instance rolls the update back; EagleNest has no CloudWatch, so its Alarms are
recorded but not read. No BlueGreenUpdatePolicy: all at once without a baking period of
its own, as SageMaker's default. RollingUpdatePolicy is recorded (LastDeploymentConfig) and
applied all at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from eaglenest.foundation.errors import ValidationException

CANARY, LINEAR, ALL_AT_ONCE = "CANARY", "LINEAR", "ALL_AT_ONCE"
INSTANCE_COUNT, CAPACITY_PERCENT = "INSTANCE_COUNT", "CAPACITY_PERCENT"
#: per Type: the size member it needs, and the smallest and largest share of the fleet
SIZES = {CANARY: ("CanarySize", 0.0, 0.5), LINEAR: ("LinearStepSize", 0.1, 0.5)}


@dataclass
class Plan:
    #: (share of traffic on the new fleet, seconds to wait after setting it)
    steps: list[tuple[float, float]] = field(default_factory=lambda: [(1.0, 0.0)])
    max_seconds: float | None = None
    auto_rollback: bool = False


def _share(size: dict[str, Any], instances: int) -> float:
    if size["Type"] == INSTANCE_COUNT:
        return float(size["Value"]) / instances
    return float(size["Value"]) / 100


def _check_size(route: dict[str, Any], instances: int) -> None:
    kind = route["Type"]
    for other, (member, _, _) in SIZES.items():
        if route.get(member) is not None and kind != other:
            raise ValidationException(
                f"TrafficRoutingConfiguration.{member} can be specified only when Type is "
                f"{other} (Type is {kind}).")
    if kind not in SIZES:
        return
    member, low, high = SIZES[kind]
    size = route.get(member)
    if size is None:
        raise ValidationException(
            f"TrafficRoutingConfiguration.{member} must be specified when Type is {kind}.")
    share = _share(size, instances)
    if not ((low <= share) if low else (share > 0)) or share > high:
        unit = "%" if size["Type"] == CAPACITY_PERCENT else " instance(s)"
        raise ValidationException(
            f"TrafficRoutingConfiguration.{member} Value {size['Value']}{unit} is "
            f"{share:.0%} of the new fleet ({instances} instance(s)); it must be "
            + (f"{low:.0%}-{high:.0%}" if low else f"at most {high:.0%}") + " of it.")


def check(config: dict[str, Any] | None, instances: int) -> None:
    """The DeploymentConfig of an UpdateEndpoint against the new fleet's instance count."""
    if not config:
        return
    policy = config.get("BlueGreenUpdatePolicy")
    if policy is not None and config.get("RollingUpdatePolicy") is not None:
        raise ValidationException(
            "DeploymentConfig: specify only one of BlueGreenUpdatePolicy and "
            "RollingUpdatePolicy.")
    if policy is None:
        return
    _check_size(policy["TrafficRoutingConfiguration"], instances)
    limit = policy.get("MaximumExecutionTimeoutInSeconds")
    waited = sum(wait for _, wait in plan(config, instances).steps)
    if limit is not None and limit <= waited:
        raise ValidationException(
            f"BlueGreenUpdatePolicy.MaximumExecutionTimeoutInSeconds ({limit}) must be larger "
            f"than the total waiting time of the deployment ({waited:.0f} s of "
            "WaitIntervalInSeconds per step and TerminationWaitInSeconds).")


def plan(config: dict[str, Any] | None, instances: int) -> Plan:
    """The steps of a checked DeploymentConfig for a new fleet of `instances`."""
    auto = bool(config and config.get("AutoRollbackConfiguration") is not None)
    policy = (config or {}).get("BlueGreenUpdatePolicy")
    if policy is None:
        return Plan(auto_rollback=auto)
    route = policy["TrafficRoutingConfiguration"]
    wait = float(route["WaitIntervalInSeconds"])
    if route["Type"] == CANARY:
        shares = [_share(route["CanarySize"], instances), 1.0]
    elif route["Type"] == LINEAR:
        step = _share(route["LinearStepSize"], instances)
        shares = [min(1.0, round(step * (i + 1), 6)) for i in range(math.ceil(1 / step - 1e-9))]
    else:
        shares = [1.0]
    steps = [(s, wait) for s in shares]
    steps[-1] = (1.0, wait + float(policy.get("TerminationWaitInSeconds") or 0))
    limit = policy.get("MaximumExecutionTimeoutInSeconds")
    return Plan(steps, float(limit) if limit is not None else None, auto)
