"""CloudWatch's edge: signatures (through both protocols' clients) and the CBOR wire itself
(raw requests signed as botocore signs them, sent with httpx): timestamps as tag 1, the
error body and header, and bodies that are not what a client sends."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import cbor2
import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.api.cloudwatch.conftest import T0, Series, client, error
from tests.support.stack import ACCESS_KEY, REGION, SECRET_KEY, Stack

PATH = "/service/GraniteServiceVersion20100801/operation/"


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as c:
        yield c


def signed(stack: Stack, http: httpx.Client, op: str, body: bytes,
           **headers: str) -> httpx.Response:
    req = AWSRequest(method="POST", url=f"{stack.url}{PATH}{op}", data=body, headers={
        "Content-Type": "application/cbor", "Accept": "application/cbor",
        "smithy-protocol": "rpc-v2-cbor", **headers})
    SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "monitoring", REGION).add_auth(req)
    return http.post(req.url, content=body, headers=dict(req.headers.items()))


def refused(r: httpx.Response) -> tuple[int, str, str, str]:
    """(status, __type, message, x-amzn-query-error) of a CBOR error reply."""
    assert r.headers["content-type"] == "application/cbor"
    assert r.headers["smithy-protocol"] == "rpc-v2-cbor"
    body = cbor2.loads(r.content)
    return r.status_code, body["__type"], body["message"], r.headers["x-amzn-query-error"]


def test_replies_are_cbor_with_tag_1_timestamps(stack, http, series: Series):
    r = signed(stack, http, "GetMetricStatistics", cbor2.dumps({
        "Namespace": "AWS/SageMaker", "MetricName": "Invocations",
        "Dimensions": series.dimensions, "StartTime": T0, "EndTime": T0 + 600, "Period": 600,
        "Statistics": ["Sum"]}))
    assert r.status_code == 200, r.content
    assert (r.headers["content-type"], r.headers["smithy-protocol"]) == (
        "application/cbor", "rpc-v2-cbor")
    assert r.headers["x-amzn-requestid"]
    assert b"\xc1" in r.content  # CBOR tag 1
    point = cbor2.loads(r.content)["Datapoints"][0]
    assert isinstance(point["Timestamp"], datetime) and point["Timestamp"].timestamp() == T0


def test_cloudwatch_errors_carry_the_query_code_header(stack, http):
    r = signed(stack, http, "GetMetricStatistics", cbor2.dumps({
        "Namespace": "AWS/SageMaker", "MetricName": "Invocations", "StartTime": T0,
        "EndTime": T0 + 600, "Period": 90, "Statistics": ["Sum"]}))
    assert refused(r) == (400, "com.amazonaws.cloudwatch#InvalidParameterValueException",
                          "The parameter Period must be a multiple of 60.",
                          "InvalidParameterValue;Sender")


#: {"Namespace": tag 28 [tag 29 0]}: a shared list holding itself
CYCLE = b"\xa1" + cbor2.dumps("Namespace") + bytes.fromhex("d81c81d81d00")


@pytest.mark.parametrize(("body", "message"), [
    (b"\xff\x00", "Request body is not valid CBOR."),
    (cbor2.dumps([1, 2]), "Request body must be a CBOR map."),
    (CYCLE, "Request body nests CBOR deeper than 32 levels."),
    (cbor2.dumps({1: "x"}), "Request body has a map key that is not text."),
    (cbor2.dumps({"Namespace": {1, 2}}), "Request body holds a CBOR value of type set, which "
     "no member of CloudWatch's shapes takes."),
], ids=["garbage", "array", "cycle", "int-key", "set"])
def test_bodies_no_client_sends_are_serialization_errors(stack, http, body, message):
    assert refused(signed(stack, http, "ListMetrics", body)) == (
        400, "SerializationException", message, "SerializationException;Sender")


def test_unknown_operations_and_large_bodies(stack, http):
    status, kind, text, _ = refused(signed(stack, http, "PutMetricData", cbor2.dumps({})))
    assert (status, kind) == (400, "UnknownOperationException")
    assert text.startswith("Operation PutMetricData is not supported by EagleNest's CloudWatch")
    r = signed(stack, http, "ListMetrics", b"\xa0" + b" " * (1024 * 1024))
    assert refused(r)[:3] == (413, "com.amazonaws.cloudwatch#RequestEntityTooLarge",
                              "Request size exceeded 1048576 bytes.")


def test_wrong_secrets_and_unknown_keys_are_refused(stack, protocol, cbor_data_path):
    cases: list[tuple[dict[str, Any], str]] = [
        ({"secret": "not-the-secret"}, "InvalidSignatureException"),
        ({"key": "AKIANOSUCHKEY0000000"}, "UnrecognizedClientException")]
    for creds, code in cases:
        cw = client(stack, protocol, cbor_data_path, **creds)
        with pytest.raises(ClientError) as exc:
            cw.list_metrics()
        assert error(exc)[::2] == (code, 403)


def test_unsigned_requests_are_refused_in_cbor(stack, http):
    r = http.post(f"{stack.url}{PATH}ListMetrics", content=cbor2.dumps({}),
                  headers={"content-type": "application/cbor"})
    status, kind, text, _ = refused(r)
    assert (status, kind) == (403, "InvalidSignatureException")
    assert text.startswith("Request is missing Authentication Token")


def test_cbor_requests_are_counted_in_the_api_metrics(stack, http):
    assert signed(stack, http, "ListMetrics", cbor2.dumps({})).status_code == 200
    signed(stack, http, "ListMetrics", b"\xff")
    text = http.get(f"{stack.url}/metrics").text
    lines = [line for line in text.splitlines()
             if "cloudwatch:ListMetrics" in line and not line.startswith("#")]
    assert any('"OK"' in line for line in lines), text[-2000:]
    assert any('"SerializationException"' in line for line in lines), text[-2000:]
