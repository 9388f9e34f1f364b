"""Blue/green UpdateEndpoint for real (db/traffic_policy.py, workers/serving/shift.py): the new
fleet starts beside the old one, InvokeEndpoint reaches it with each step's share of the
traffic (counted through InvokedProductionVariant), the endpoint stays Updating with the step
in PendingDeploymentSummary, then the old fleet stops; AutoRollbackConfiguration rolls back
a new fleet that fails its health check mid-shift."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from botocore.exceptions import ClientError
from scipy.stats import binomtest

from tests.support.jobs import ROLE, upload
from tests.support.stack import Stack
from tests.workers.serving.test_endpoint_serving import _get, _gone, container, in_service

#: a binomial test of the observed split fails a correct router once in this many runs
ALPHA = 1e-4


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_llama_dir):
    s = Stack(tmp_path_factory.mktemp("shift")).start()
    upload(s, tiny_llama_dir, "s3://models/tiny/")
    sm = s.client()
    for model, variant in (("tiny-blue", "Blue"), ("tiny-green", "Green")):
        sm.create_model(ModelName=model, ExecutionRoleArn=ROLE, PrimaryContainer=container(False))
        sm.create_endpoint_config(EndpointConfigName=variant.lower(), ProductionVariants=[{
            "VariantName": variant, "ModelName": model, "InstanceType": "ml.g5.2xlarge",
            "InitialInstanceCount": 1, "ContainerStartupHealthCheckTimeoutInSeconds": 120}])
    yield s
    s.stop()


def _alive(stack: Stack, url: str) -> None:
    """The instance answers /health to its secret (foundation/http/instance_auth.py)."""
    assert _get(stack, url, "/health", timeout=5).status_code == 200


def blue_green(kind: str, wait: int, **route) -> dict:
    return {"BlueGreenUpdatePolicy": {
        "TrafficRoutingConfiguration": {"Type": kind, "WaitIntervalInSeconds": wait, **route},
        "TerminationWaitInSeconds": 2, "MaximumExecutionTimeoutInSeconds": 600}}


def wait_step(sm, name: str, share: str) -> dict:
    """The VariantStatus of the new fleet once the step with `share` of traffic began."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        d = sm.describe_endpoint(EndpointName=name)
        assert d["EndpointStatus"] == "Updating", d
        for v in d.get("PendingDeploymentSummary", {}).get("ProductionVariants", []):
            status = v["VariantStatus"][0]
            if status["StatusMessage"].startswith(f"{share} of traffic"):
                assert status["Status"] == "Baking"
                time.sleep(1.5)  # the router's route cache (1 s) sees the step
                return status
        time.sleep(0.3)
    raise AssertionError(f"no step with {share} of traffic on the new fleet")


def invoke_until(rt, name: str, n: int, until: float) -> list[str]:
    """Up to `n` invocations before time.time() reaches `until`: the variants that served."""
    served = []
    body = json.dumps({"inputs": "Natalia sold", "parameters": {"max_new_tokens": 1}})
    while len(served) < n and time.time() < until:
        r = rt.invoke_endpoint(EndpointName=name, ContentType="application/json", Body=body)
        served.append(r["InvokedProductionVariant"])
    return served


def test_once_in_service_no_request_reaches_the_old_fleet(stack: Stack):
    """An update with no DeploymentConfig (all at once): every request sent after
    DescribeEndpoint first says InService is served by the new fleet, though the router keeps
    routes cached (route_cache_seconds, 1 s) and was busy with the old fleet all along."""
    sm = stack.client()
    sm.create_endpoint(EndpointName="switch", EndpointConfigName="blue")
    in_service(sm, "switch")
    served: list[tuple[float, str]] = []  # (time.monotonic() the request was sent, variant)
    done = threading.Event()

    def invoke() -> None:
        rt = stack.client("sagemaker-runtime")
        body = json.dumps({"inputs": "Natalia sold", "parameters": {"max_new_tokens": 1}})
        while not done.is_set():
            sent = time.monotonic()
            r = rt.invoke_endpoint(EndpointName="switch", ContentType="application/json",
                                   Body=body)
            served.append((sent, r["InvokedProductionVariant"]))

    caller = threading.Thread(target=invoke)
    caller.start()
    try:
        sm.update_endpoint(EndpointName="switch", EndpointConfigName="green")
        deadline, steps = time.monotonic() + 180, {}
        while (d := sm.describe_endpoint(EndpointName="switch"))["EndpointStatus"] != "InService":
            assert time.monotonic() < deadline, "the update did not finish"
            for v in d.get("PendingDeploymentSummary", {}).get("ProductionVariants", []):
                status = v["VariantStatus"][0]
                steps.setdefault(status["StatusMessage"], time.monotonic())
            time.sleep(0.05)
        switched = time.monotonic()
        time.sleep(3)
    finally:
        done.set()
        caller.join(60)
    # the one step (all traffic on the new fleet) lasted the routers' cache and its margin
    (message, shown), = steps.items()
    assert message == "100% of traffic on the new fleet (step 1 of 1), baking for 2 s"
    assert switched - shown >= 1.5 - 0.1, switched - shown
    before = {v for t, v in served if t < switched}
    after = [v for t, v in served if t > switched]
    assert "Blue" in before and len(after) >= 10, (before, len(after))
    assert set(after) == {"Green"}, f"{after.count('Blue')} of {len(after)} reached the old fleet"
    sm.delete_endpoint(EndpointName="switch")


def test_canary_shifts_the_stated_share(stack: Stack):
    sm, rt = stack.client(), stack.client("sagemaker-runtime")
    sm.create_endpoint(EndpointName="canary", EndpointConfigName="blue")
    in_service(sm, "canary")
    old_url = stack.deployment("canary")["Servers"]["Blue"]["url"]
    wait = 30
    config = blue_green("CANARY", wait, CanarySize={"Type": "CAPACITY_PERCENT", "Value": 25})
    sm.update_endpoint(EndpointName="canary", EndpointConfigName="green", DeploymentConfig=config)
    step = wait_step(sm, "canary", "25%")
    served = invoke_until(rt, "canary", 200, step["StartTime"].timestamp() + wait - 2)
    d = sm.describe_endpoint(EndpointName="canary")
    assert d["EndpointStatus"] == "Updating" and d["EndpointConfigName"] == "blue"
    assert d["PendingDeploymentSummary"]["EndpointConfigName"] == "green"
    assert d["PendingDeploymentSummary"]["ProductionVariants"][0]["VariantStatus"][0] == step
    green = served.count("Green")
    assert len(served) >= 60 and green + served.count("Blue") == len(served)
    assert binomtest(green, len(served), 0.25).pvalue > ALPHA, (green, len(served))
    print(f"canary step: {green}/{len(served)} requests on the new fleet (25% stated)")

    step = wait_step(sm, "canary", "100%")
    served = invoke_until(rt, "canary", 30, step["StartTime"].timestamp() + wait - 2)
    assert set(served) == {"Green"} and len(served) >= 10
    assert sm.describe_endpoint(EndpointName="canary")["EndpointStatus"] == "Updating"
    assert stack.deployment("canary")["Servers"]["Blue"]["url"] == old_url  # kept till the end
    _alive(stack, old_url)

    d = in_service(sm, "canary")
    assert d["EndpointConfigName"] == "green" and "PendingDeploymentSummary" not in d
    assert d["LastDeploymentConfig"] == config
    assert [v["VariantName"] for v in d["ProductionVariants"]] == ["Green"]
    _gone(old_url)
    assert set(invoke_until(rt, "canary", 10, time.time() + 60)) == {"Green"}


def test_linear_rolls_back_a_failing_new_fleet(stack: Stack):
    sm, rt = stack.client(), stack.client("sagemaker-runtime")
    sm.create_endpoint(EndpointName="linear", EndpointConfigName="blue")
    in_service(sm, "linear")
    config = {**blue_green("LINEAR", 60, LinearStepSize={"Type": "CAPACITY_PERCENT",
                                                          "Value": 50}),
              "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "latency"}]}}
    sm.update_endpoint(EndpointName="linear", EndpointConfigName="green", DeploymentConfig=config)
    step = wait_step(sm, "linear", "50%")
    assert step["StatusMessage"] == "50% of traffic on the new fleet (step 1 of 2), baking for 60 s"
    served = invoke_until(rt, "linear", 60, step["StartTime"].timestamp() + 50)
    green = served.count("Green")
    assert binomtest(green, len(served), 0.5).pvalue > ALPHA, (green, len(served))
    print(f"linear step 1: {green}/{len(served)} requests on the new fleet (50% stated)")

    new = stack.deployment("linear")["Shift"]["Servers"]["Green"]["instances"][0]
    os.kill(int(new["pid"]), signal.SIGKILL)
    d = in_service(sm, "linear")
    assert d["EndpointConfigName"] == "blue" and "PendingDeploymentSummary" not in d
    assert d["FailureReason"].startswith(
        "Update to green failed and was rolled back: the new fleet failed its health check "
        "while traffic shifted (Green instance 0 did not answer /health)"), d
    assert d["LastDeploymentConfig"] == config
    assert "Shift" not in stack.deployment("linear")
    assert set(invoke_until(rt, "linear", 20, time.time() + 60)) == {"Blue"}


def test_policy_checked_against_the_new_fleet(stack: Stack):
    sm = stack.client()
    sm.create_endpoint(EndpointName="checked", EndpointConfigName="blue")
    in_service(sm, "checked")
    bad = blue_green("CANARY", 5, CanarySize={"Type": "INSTANCE_COUNT", "Value": 1})
    with pytest.raises(ClientError) as exc:
        sm.update_endpoint(EndpointName="checked", EndpointConfigName="green",
                           DeploymentConfig=bad)
    err = exc.value.response["Error"]
    assert err["Code"] == "ValidationException"
    assert err["Message"] == ("TrafficRoutingConfiguration.CanarySize Value 1 instance(s) is "
                              "100% of the new fleet (1 instance(s)); it must be at most 50% "
                              "of it.")
    d = sm.describe_endpoint(EndpointName="checked")
    assert (d["EndpointStatus"], d["EndpointConfigName"]) == ("InService", "blue")
    assert "LastDeploymentConfig" not in d
