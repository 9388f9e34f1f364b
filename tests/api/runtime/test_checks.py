"""What sagemaker-runtime checks itself (header formats, body size, endpoint name) and
what it leaves to the container (any body, any content type)."""

from __future__ import annotations

import pytest

from eaglenest.api.runtime.bodies import ContainerRejected, RuntimeValidationError, translate
from eaglenest.api.runtime.checks import MAX_BODY, check_request


def test_headers_and_body_within_limits_pass() -> None:
    check_request("ep-1", {"content-type": "text/csv", "accept": "image/png",
                           "x-amzn-sagemaker-inference-id": "req 1",
                           "x-amzn-sagemaker-target-variant": "A-1"}, b"x" * MAX_BODY)


@pytest.mark.parametrize(("name", "headers", "body", "message"), [
    ("ep", {"x-amzn-sagemaker-custom-attributes": "caf\u00e9"}, b"",
     "1 validation error detected: Value 'caf\u00e9' at 'customAttributes' failed to satisfy "
     "constraint: Member must satisfy regular expression pattern: \\p{ASCII}*"),
    ("ep", {"x-amzn-sagemaker-inference-id": " lead"}, b"",
     "1 validation error detected: Value ' lead' at 'inferenceId' failed to satisfy "
     "constraint: Member must satisfy regular expression pattern: \\A\\S[\\p{Print}]*\\z"),
    ("bad_name", {}, b"",
     "1 validation error detected: Value 'bad_name' at 'endpointName' failed to satisfy "
     "constraint: Member must satisfy regular expression pattern: ^[a-zA-Z0-9](-*[a-zA-Z0-9])*"),
    ("ep", {"content-type": "a" * 1025}, b"x" * (MAX_BODY + 1),
     "2 validation errors detected: Value '" + "a" * 253 + "...' at 'contentType' failed to "
     "satisfy constraint: Member must have length less than or equal to 1024; Value at 'body' "
     "failed to satisfy constraint: Member must have length less than or equal to 6291456"),
])
def test_sagemaker_refuses(name: str, headers: dict[str, str], body: bytes, message: str) -> None:
    with pytest.raises(RuntimeValidationError) as exc:
        check_request(name, headers, body)
    assert exc.value.message == message


@pytest.mark.parametrize(("raw", "content_type", "status"), [
    (b"not json", "application/json", 400),
    (b"[1]", "application/json", 400),
    (b'{"other": 1}', None, 400),
    (b"1,2", "text/csv", 415),
    (b"\xff", "text/plain", 400),
    (b'{"inputs": 3}', "application/json", 400),
])
def test_the_container_refuses_what_it_does_not_read(raw: bytes, content_type: str | None,
                                                      status: int) -> None:
    with pytest.raises(ContainerRejected) as exc:
        translate(raw, "m", False, content_type)
    assert exc.value.status == status


def test_the_container_reads_lmi_openai_and_text() -> None:
    assert translate(b"hello", "m", False, "text/plain; charset=utf-8").body["prompt"] == "hello"
    assert translate(b'{"inputs": "hi"}', "m", True, None).style == "lmi"
    chat = translate(b'{"messages": []}', "m", False, "application/vnd.x+json")
    assert chat.path == "/v1/chat/completions"
