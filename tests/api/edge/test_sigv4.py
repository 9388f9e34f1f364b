"""SigV4: unsigned, wrongly signed, unknown key, wrong region and stale requests get 403."""

from __future__ import annotations

import json

import httpx
import pytest
from botocore.exceptions import ClientError
from prometheus_client.parser import text_string_to_metric_families

from eaglenest.api.edge.sigv4 import SignedRequest, verify
from eaglenest.foundation.errors import ServiceError


def test_unsigned_request_is_rejected(stack):
    r = httpx.post(f"{stack.url}/", content=b"{}", headers={
        "X-Amz-Target": "SageMaker.ListModels", "Content-Type": "application/x-amz-json-1.1"})
    assert r.status_code == 403
    assert r.json()["__type"] == "InvalidSignatureException"
    assert "missing Authentication Token" in r.json()["message"]
    assert r.headers["x-amzn-RequestId"]


def test_wrong_secret_is_rejected(stack):
    client = stack.client(secret="not-the-secret-0000000000000000000000000")
    with pytest.raises(ClientError) as exc:
        client.list_models()
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert exc.value.response["Error"]["Code"] == "InvalidSignatureException"
    assert "does not match" in exc.value.response["Error"]["Message"]


def test_unknown_access_key_is_rejected(stack):
    with pytest.raises(ClientError) as exc:
        stack.client(key="AKIAUNKNOWNKEY000000").list_models()
    assert exc.value.response["Error"]["Code"] == "UnrecognizedClientException"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_wrong_region_is_rejected(stack):
    with pytest.raises(ClientError) as exc:
        stack.client(region="eu-west-1").list_models()
    assert exc.value.response["Error"]["Code"] == "InvalidSignatureException"
    assert "'us-east-1'" in exc.value.response["Error"]["Message"]


def test_tampered_body_is_rejected(stack, sm):
    """Sign one body, send another: the payload hash no longer matches."""
    captured: dict[str, object] = {}

    def grab(request, **_):  # type: ignore[no-untyped-def]
        captured["headers"] = dict(request.headers)
        captured["body"] = request.body

    sm.meta.events.register("before-send.sagemaker.ListModels", grab)
    try:
        sm.list_models(MaxResults=5)
    finally:
        sm.meta.events.unregister("before-send.sagemaker.ListModels", grab)
    headers = {k: (v.decode() if isinstance(v, bytes) else v)
               for k, v in captured["headers"].items()}  # type: ignore[union-attr]
    ok = httpx.post(f"{stack.url}/", content=captured["body"], headers=headers)
    assert ok.status_code == 200, ok.text
    bad = httpx.post(f"{stack.url}/", content=json.dumps({"MaxResults": 6}), headers=headers)
    assert bad.status_code == 403
    assert bad.json()["__type"] == "InvalidSignatureException"


def test_expired_signature_unit():
    headers = {
        "authorization": "AWS4-HMAC-SHA256 Credential=AK/20200101/us-east-1/sagemaker/"
                         "aws4_request, SignedHeaders=host;x-amz-date, Signature=" + "0" * 64,
        "x-amz-date": "20200101T000000Z", "host": "127.0.0.1",
    }
    req = SignedRequest("POST", "http://127.0.0.1/", headers, b"{}")
    with pytest.raises(ServiceError) as exc:
        verify(req, {"AK": "secret"}, "us-east-1", max_skew=900)
    assert exc.value.code == "InvalidSignatureException"
    assert exc.value.message.startswith("Signature expired")


def test_unknown_operation_and_bad_json(signed_post):
    r = signed_post("SageMaker.CreateTrainingJob", b"{}")
    assert r.status_code == 400
    assert r.json()["__type"] == "UnknownOperationException"
    assert "CreateTrainingJob" in r.json()["message"]
    r = signed_post("SageMaker.ListModels", b"{not json")
    assert r.status_code == 400
    assert r.json() == {"__type": "SerializationException",
                        "message": "Request body is not valid JSON."}
    r = signed_post("SageMaker.ListModels", b'{"MaxResults": "ten"}')
    assert r.status_code == 400
    assert r.json()["__type"] == "SerializationException"
    assert r.json()["message"] == "Invalid type at 'maxResults': expected integer, got string"


def test_prometheus_metrics(stack, sm, unique):
    sm.list_models(MaxResults=1)
    with pytest.raises(ClientError):
        sm.describe_model(ModelName=f"{unique}-missing")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(httpx.get(f"{stack.url}/metrics").text)
               for s in f.samples}
    assert samples["eaglenest_requests_total", (("code", "OK"),
                                                ("operation", "ListModels"))] >= 1
    assert samples["eaglenest_requests_total", (("code", "ValidationException"),
                                                ("operation", "DescribeModel"))] >= 1
    assert samples["eaglenest_database_up", ()] == 1


def test_invocation_paths_accept_post_only(stack):
    for path in ("invocations", "invocations-response-stream"):
        r = httpx.get(f"{stack.url}/endpoints/any/{path}")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert r.json()["message"] == f"Method GET not allowed: /endpoints/any/{path} accepts POST only"
    assert httpx.get(f"{stack.url}/endpoints/any/other").status_code == 404
