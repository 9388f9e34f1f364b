"""Endpoints through boto3: lifecycle, UpdateEndpoint rules, waiters.

The serving backends are issue #5; where a test needs an endpoint InService or Failed it
applies the same state transition a serving worker applies (db.endpoints_repo).
"""

from __future__ import annotations

import threading
import time

import pytest
from botocore.exceptions import ClientError, WaiterError

from eaglenest.db import endpoints_repo
from eaglenest.db.session import Database

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"
DEPLOYED = {"ProductionVariants": [{"VariantName": "AllTraffic", "CurrentWeight": 1.0,
                                    "DesiredWeight": 1.0, "CurrentInstanceCount": 1,
                                    "DesiredInstanceCount": 1}]}


@pytest.fixture
def db(stack):
    d = Database(stack.database_url)
    yield d
    d.dispose()


@pytest.fixture
def config(sm, unique):
    sm.create_model(ModelName=unique, ExecutionRoleArn=ROLE, PrimaryContainer={"Image": "lmi"})
    sm.create_endpoint_config(EndpointConfigName=unique, ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": unique, "InstanceType": "ml.g5.2xlarge",
        "InitialInstanceCount": 1}])
    return unique


def code_and_message(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, str]:
    return exc.value.response["Error"]["Code"], exc.value.response["Error"]["Message"]


def test_create_is_creating_until_served(sm, config):
    arn = sm.create_endpoint(EndpointName=config, EndpointConfigName=config,
                             Tags=[{"Key": "k", "Value": "v"}])["EndpointArn"]
    assert arn == f"arn:aws:sagemaker:us-east-1:123456789012:endpoint/{config.lower()}"
    d = sm.describe_endpoint(EndpointName=config)
    assert d["EndpointStatus"] == "Creating"
    assert d["EndpointConfigName"] == config
    assert "ProductionVariants" not in d
    assert d["LastModifiedTime"] >= d["CreationTime"]
    listed = sm.list_endpoints(NameContains=config, StatusEquals="Creating")["Endpoints"]
    assert [e["EndpointName"] for e in listed] == [config]
    assert sm.list_endpoints(NameContains=config, StatusEquals="InService")["Endpoints"] == []


def test_create_needs_existing_config_and_unique_name(sm, config, unique):
    with pytest.raises(ClientError) as exc:
        sm.create_endpoint(EndpointName=f"{unique}-x", EndpointConfigName="nope")
    assert code_and_message(exc) == ("ValidationException", 'Could not find endpoint '
        'configuration "arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/nope".')
    sm.create_endpoint(EndpointName=config, EndpointConfigName=config)
    with pytest.raises(ClientError) as exc:
        sm.create_endpoint(EndpointName=config, EndpointConfigName=config)
    assert code_and_message(exc)[0] == "ValidationException"
    assert code_and_message(exc)[1].startswith("Cannot create already existing endpoint")


def test_status_filter_enum_is_checked(sm):
    with pytest.raises(ClientError) as exc:
        sm.list_endpoints(StatusEquals="Running")
    assert code_and_message(exc)[0] == "ValidationException"
    assert "at 'statusEquals' failed to satisfy constraint: Member must satisfy enum" in \
        code_and_message(exc)[1]


def test_update_rules(sm, db, config, unique):
    sm.create_endpoint(EndpointName=config, EndpointConfigName=config)
    with pytest.raises(ClientError) as exc:
        sm.update_endpoint(EndpointName=config, EndpointConfigName=config)
    assert code_and_message(exc)[0] == "ValidationException"
    assert "while it is Creating" in code_and_message(exc)[1]
    with db.session() as s:
        endpoints_repo.mark_in_service(s, config, DEPLOYED)
    assert sm.describe_endpoint(EndpointName=config)["EndpointStatus"] == "InService"
    with pytest.raises(ClientError) as exc:
        sm.update_endpoint(EndpointName=config, EndpointConfigName="missing-config")
    assert "Could not find endpoint configuration" in code_and_message(exc)[1]
    sm.create_endpoint_config(EndpointConfigName=f"{unique}-v2", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": config, "InstanceType": "ml.g5.2xlarge",
        "InitialInstanceCount": 1}])
    sm.update_endpoint(EndpointName=config, EndpointConfigName=f"{unique}-v2")
    d = sm.describe_endpoint(EndpointName=config)
    assert d["EndpointStatus"] == "Updating"
    assert d["PendingDeploymentSummary"]["EndpointConfigName"] == f"{unique}-v2"
    assert d["EndpointConfigName"] == config
    with pytest.raises(ClientError):
        sm.update_endpoint(EndpointName=config, EndpointConfigName=f"{unique}-v2")
    with db.session() as s:
        endpoints_repo.finish_update(s, config, DEPLOYED)
    d = sm.describe_endpoint(EndpointName=config)
    assert (d["EndpointStatus"], d["EndpointConfigName"]) == ("InService", f"{unique}-v2")


def test_update_missing_endpoint(sm):
    with pytest.raises(ClientError) as exc:
        sm.update_endpoint(EndpointName="no-such-endpoint", EndpointConfigName="c")
    assert code_and_message(exc) == ("ValidationException", 'Could not find endpoint '
        '"arn:aws:sagemaker:us-east-1:123456789012:endpoint/no-such-endpoint".')


def test_waiter_in_service(sm, db, config):
    sm.create_endpoint(EndpointName=config, EndpointConfigName=config)

    def serve_later() -> None:
        time.sleep(1.0)
        with db.session() as s:
            endpoints_repo.mark_in_service(s, config, DEPLOYED)

    t = threading.Thread(target=serve_later)
    t.start()
    sm.get_waiter("endpoint_in_service").wait(
        EndpointName=config, WaiterConfig={"Delay": 1, "MaxAttempts": 20})
    t.join()
    d = sm.describe_endpoint(EndpointName=config)
    assert d["ProductionVariants"][0]["VariantName"] == "AllTraffic"


def test_waiter_in_service_fails_on_failed(sm, db, config):
    sm.create_endpoint(EndpointName=config, EndpointConfigName=config)
    with db.session() as s:
        endpoints_repo.mark_failed(s, config, "process exited with code 1")
    with pytest.raises(WaiterError) as exc:
        sm.get_waiter("endpoint_in_service").wait(
            EndpointName=config, WaiterConfig={"Delay": 1, "MaxAttempts": 3})
    assert "Failed" in str(exc.value)
    assert sm.describe_endpoint(EndpointName=config)["FailureReason"] == \
        "process exited with code 1"


def test_delete_deployed_endpoint_turns_deleting(sm, db, config):
    """A deployed endpoint is not removed by the API: it turns Deleting and a serve worker
    (tests/workers) stops its processes and removes it."""
    sm.create_endpoint(EndpointName=config, EndpointConfigName=config)
    with db.session() as s:
        endpoints_repo.mark_in_service(s, config, DEPLOYED)
    sm.delete_endpoint(EndpointName=config)
    assert sm.describe_endpoint(EndpointName=config)["EndpointStatus"] == "Deleting"


def test_delete_undeployed_endpoint_and_waiter(sm, config):
    sm.create_endpoint(EndpointName=config, EndpointConfigName=config)
    sm.delete_endpoint(EndpointName=config)
    sm.get_waiter("endpoint_deleted").wait(
        EndpointName=config, WaiterConfig={"Delay": 1, "MaxAttempts": 5})
    with pytest.raises(ClientError) as exc:
        sm.delete_endpoint(EndpointName=config)
    assert code_and_message(exc)[0] == "ValidationException"


def test_weights_and_capacities_rules(stack, sm, db, config):
    """UpdateEndpointWeightsAndCapacities: its errors change nothing; an accepted change
    shows as Desired* at once and the endpoint goes Updating (tests/workers apply it)."""
    sm.create_endpoint(EndpointName=config, EndpointConfigName=config)
    change = [{"VariantName": "AllTraffic", "DesiredWeight": 3.0, "DesiredInstanceCount": 2}]
    with pytest.raises(ClientError) as exc:
        sm.update_endpoint_weights_and_capacities(EndpointName=config,
                                                  DesiredWeightsAndCapacities=change)
    assert "while it is Creating" in code_and_message(exc)[1]
    with db.session() as s:
        endpoints_repo.mark_in_service(s, config, DEPLOYED)
    before = sm.describe_endpoint(EndpointName=config)
    del before["ResponseMetadata"]
    arn = f"arn:aws:sagemaker:us-east-1:123456789012:endpoint/{config.lower()}"
    cases = [
        ("no-such", change, "ValidationException", f'Could not find endpoint "{arn[:-len(config)]}no-such".'),
        (config, change * 2, "ValidationException",
         'The variant name "AllTraffic" was non-unique within the request.'),
        (config, [{"VariantName": "Nope", "DesiredWeight": 1.0}], "ValidationException",
         f'The variant name(s) "Nope" is/are not present within endpoint configuration "{config}".'),
        (config, [{"VariantName": "AllTraffic", "DesiredInstanceCount": 5}],
         "ResourceLimitExceeded", "Variant AllTraffic: DesiredInstanceCount is 5, but this "
         "service runs at most 4 instances (model server processes) per variant "
         "(EAGLENEST_MAX_INSTANCES_PER_VARIANT)."),
        (config, [{"VariantName": "AllTraffic", "DesiredInstanceCount": 0}],
         "ValidationException", "Variant AllTraffic: DesiredInstanceCount must be at least 1 "
         "(scaling a variant to zero instances is not supported)."),
    ]
    for name, desired, code, message in cases:
        with pytest.raises(ClientError) as exc:
            sm.update_endpoint_weights_and_capacities(EndpointName=name,
                                                      DesiredWeightsAndCapacities=desired)
        assert code_and_message(exc) == (code, message)
        after = sm.describe_endpoint(EndpointName=config)
        del after["ResponseMetadata"]
        assert after == before
    out = sm.update_endpoint_weights_and_capacities(EndpointName=config,
                                                    DesiredWeightsAndCapacities=change)
    assert out["EndpointArn"] == arn
    d = sm.describe_endpoint(EndpointName=config)
    assert d["EndpointStatus"] == "Updating"
    assert d["ProductionVariants"] == [{"VariantName": "AllTraffic", "CurrentWeight": 1.0,
                                        "DesiredWeight": 3.0, "CurrentInstanceCount": 1,
                                        "DesiredInstanceCount": 2}]
    with pytest.raises(ClientError) as exc:  # one change at a time
        sm.update_endpoint_weights_and_capacities(EndpointName=config,
                                                  DesiredWeightsAndCapacities=change)
    assert "while it is Updating" in code_and_message(exc)[1]
    with db.session() as s:
        endpoints_repo.rollback_weights(s, config, "could not start")
    d = sm.describe_endpoint(EndpointName=config)
    assert (d["EndpointStatus"], d["FailureReason"]) == ("InService", "could not start")
    assert d["ProductionVariants"] == DEPLOYED["ProductionVariants"]


BLUE_GREEN = {"BlueGreenUpdatePolicy": {
    "TrafficRoutingConfiguration": {"Type": "CANARY", "WaitIntervalInSeconds": 60,
                                    "CanarySize": {"Type": "INSTANCE_COUNT", "Value": 1}},
    "TerminationWaitInSeconds": 0}}


def test_update_retains_and_records_deployment_config(stack, sm, db, config, unique):
    """LastDeploymentConfig follows DeploymentConfig / RetainDeploymentConfig; what
    RetainAllVariantProperties keeps is carried by the pending update (the serve worker
    applies it: tests/workers)."""
    from eaglenest.db.tables import EndpointRow
    from eaglenest.foundation.accounts import Account

    sm.create_endpoint(EndpointName=config, EndpointConfigName=config,
                       DeploymentConfig=BLUE_GREEN)
    assert sm.describe_endpoint(EndpointName=config)["LastDeploymentConfig"] == BLUE_GREEN
    with db.session() as s:
        endpoints_repo.mark_in_service(s, config, DEPLOYED)
        endpoints_repo.request_weights(s, Account("us-east-1", "123456789012"), config, [
            {"VariantName": "AllTraffic", "DesiredWeight": 3.0, "DesiredInstanceCount": 2}], 4)
        endpoints_repo.finish_weights(s, config, {"ProductionVariants": [{
            "VariantName": "AllTraffic", "CurrentWeight": 3.0, "DesiredWeight": 3.0,
            "CurrentInstanceCount": 2, "DesiredInstanceCount": 2}]})
    with pytest.raises(ClientError) as exc:
        sm.update_endpoint(EndpointName=config, EndpointConfigName=config,
                           DeploymentConfig=BLUE_GREEN, RetainDeploymentConfig=True)
    assert code_and_message(exc) == ("ValidationException", "DeploymentConfig and "
        "RetainDeploymentConfig=true cannot be specified together: either give a new "
        "deployment configuration or keep the last one.")
    assert sm.describe_endpoint(EndpointName=config)["EndpointStatus"] == "InService"
    sm.update_endpoint(EndpointName=config, EndpointConfigName=config,
                       RetainAllVariantProperties=True, RetainDeploymentConfig=True,
                       ExcludeRetainedVariantProperties=[{"VariantPropertyType": "DesiredWeight"}])
    d = sm.describe_endpoint(EndpointName=config)
    assert (d["EndpointStatus"], d["LastDeploymentConfig"]) == ("Updating", BLUE_GREEN)
    with db.session() as s:
        row = s.query(EndpointRow).filter_by(name=config).one()
        assert row.spec["PendingOverrides"] == {"AllTraffic": {"DesiredInstanceCount": 2}}
        assert row.spec["PendingCapture"] == {"value": None}
        endpoints_repo.finish_update(s, config, DEPLOYED)
    sm.update_endpoint(EndpointName=config, EndpointConfigName=config)  # neither: none
    d = sm.describe_endpoint(EndpointName=config)
    assert "LastDeploymentConfig" not in d
    with db.session() as s:
        row = s.query(EndpointRow).filter_by(name=config).one()
        assert row.spec["VariantOverrides"] == {"AllTraffic": {"DesiredInstanceCount": 2}}
        assert row.spec["PendingOverrides"] == {}  # the new config's values
