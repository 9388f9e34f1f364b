"""What SageMaker itself checks on an invocation before any container sees it: the endpoint
name in the path, the request headers' lengths and patterns, and the body's size (the
botocore sagemaker-runtime model's constraints). A failure is ValidationError (400) in
AWS's aggregate wording; the body's content is never judged here (that is the container's
business: api.runtime.bodies)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from eaglenest.api.runtime.bodies import RuntimeValidationError
from eaglenest.foundation.errors import constraint_message

MAX_BODY = 6291456  # 6 MiB: InvokeEndpoint's and the streaming variant's Body limit

_ASCII = (r"\p{ASCII}*", r"(?s)[\x00-\x7f]*")
_NAME = ("^[a-zA-Z0-9](-*[a-zA-Z0-9])*", r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")
_PRINTABLE = (r"\A\S[\p{Print}]*\z", r"(?a)\S[\x20-\x7e]*")
_COMPONENT = ("^[a-zA-Z0-9]([\\-a-zA-Z0-9]*[a-zA-Z0-9])?$",
              r"[a-zA-Z0-9]([\-a-zA-Z0-9]*[a-zA-Z0-9])?")

#: header -> (member name in messages, min length, max length, (botocore pattern, python))
HEADERS: dict[str, tuple[str, int, int, tuple[str, str]]] = {
    "content-type": ("contentType", 0, 1024, _ASCII),
    "accept": ("accept", 0, 1024, _ASCII),
    "x-amzn-sagemaker-accept": ("accept", 0, 1024, _ASCII),
    "x-amzn-sagemaker-custom-attributes": ("customAttributes", 0, 1024, _ASCII),
    "x-amzn-sagemaker-target-model": ("targetModel", 1, 1024, _PRINTABLE),
    "x-amzn-sagemaker-target-variant": ("targetVariant", 0, 63, _NAME),
    "x-amzn-sagemaker-target-container-hostname": ("targetContainerHostname", 0, 63, _NAME),
    "x-amzn-sagemaker-inference-id": ("inferenceId", 1, 64, _PRINTABLE),
    "x-amzn-sagemaker-inference-component": ("inferenceComponentName", 0, 63, _COMPONENT),
}


def _violations(member: str, value: str, low: int, high: int,
                pattern: tuple[str, str]) -> list[str]:
    shown = value if len(value) <= 256 else value[:253] + "..."
    texts = []
    if re.fullmatch(pattern[1], value) is None:
        texts.append(f"Member must satisfy regular expression pattern: {pattern[0]}")
    if len(value) < low:
        texts.append(f"Member must have length greater than or equal to {low}")
    if len(value) > high:
        texts.append(f"Member must have length less than or equal to {high}")
    return [f"Value '{shown}' at '{member}' failed to satisfy constraint: {t}" for t in texts]


class BodyTooLarge(RuntimeValidationError):
    """A body over MAX_BODY: 413, refused before more of it is read."""

    status = 413


def body_too_large() -> BodyTooLarge:
    return BodyTooLarge(constraint_message([
        f"Value at 'body' failed to satisfy constraint: Member must have length less than "
        f"or equal to {MAX_BODY}"]))


def check_request(name: str, headers: Mapping[str, str], body: bytes) -> None:
    """Raise RuntimeValidationError for what SageMaker refuses before routing."""
    errors = _violations("endpointName", name, 0, 63, _NAME)
    for header, (member, low, high, pattern) in HEADERS.items():
        value = headers.get(header)
        if value is not None:
            errors += _violations(member, value, low, high, pattern)
    if len(body) > MAX_BODY:
        errors.append(f"Value at 'body' failed to satisfy constraint: Member must have length "
                      f"less than or equal to {MAX_BODY}")
    if errors:
        raise RuntimeValidationError(constraint_message(errors))
