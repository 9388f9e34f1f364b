"""AWS error shapes.

Every failure the control plane reports is a :class:`ServiceError`; one exception handler
(`api.edge.json_protocol`) renders it as ``{"__type": code, "message": message}``. botocore
reads the code only from ``__type`` for the json protocol, so the HTTP status never chooses
the code.
Deterministic failures use 400 (or 403 for auth): boto3 retries 429 and 5xx five times.
"""

from __future__ import annotations


class ServiceError(Exception):
    code = "InternalFailure"
    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def body(self) -> dict[str, str]:
        return {"__type": self.code, "message": self.message}


class ValidationException(ServiceError):
    code = "ValidationException"


class SerializationException(ServiceError):
    code = "SerializationException"


class ResourceNotFound(ServiceError):
    code = "ResourceNotFound"


class ResourceInUse(ServiceError):
    code = "ResourceInUse"


class ResourceLimitExceeded(ServiceError):
    code = "ResourceLimitExceeded"


class UnknownOperationException(ServiceError):
    code = "UnknownOperationException"


class InvalidSignatureException(ServiceError):
    code = "InvalidSignatureException"
    status = 403


class UnrecognizedClientException(ServiceError):
    code = "UnrecognizedClientException"
    status = 403


class MissingAuthenticationToken(ServiceError):
    code = "MissingAuthenticationTokenException"
    status = 403


class ServiceUnavailable(ServiceError):
    """The database or broker is unreachable: a transient failure, so 503 (retried)."""

    code = "ServiceUnavailable"
    status = 503


class InternalFailure(ServiceError):
    code = "InternalFailure"
    status = 500


def constraint_message(violations: list[str]) -> str:
    """AWS's aggregate validation message.

    >>> constraint_message(["Value 'x' at 'a' failed to satisfy constraint: Member must be y"])
    "1 validation error detected: Value 'x' at 'a' failed to satisfy constraint: Member must be y"
    """
    n = len(violations)
    noun = "error" if n == 1 else "errors"
    return f"{n} validation {noun} detected: " + "; ".join(violations)


class CloudWatchError(ServiceError):
    """CloudWatch's errors (api/cloudwatch/). CloudWatch is an awsQuery-compatible service:
    `code` is its query-protocol error code, the one botocore's ClientError reports: AWS
    JSON 1.0 replies carry it as `__type`; Smithy RPC v2 CBOR replies name the Smithy error
    `shape` in `__type` and the code in the x-amzn-query-error header (api/cloudwatch/
    wire.py)."""

    code = "InternalServiceError"
    shape = "InternalServiceFault"
    status = 400

    def query_error(self) -> str:
        """The x-amzn-query-error header: `<code>;Sender` or `<code>;Receiver` (5xx)."""
        return f"{self.code};{'Receiver' if self.status >= 500 else 'Sender'}"


class InvalidParameterValue(CloudWatchError):
    code = "InvalidParameterValue"
    shape = "InvalidParameterValueException"


class InvalidParameterCombination(CloudWatchError):
    code = "InvalidParameterCombination"
    shape = "InvalidParameterCombinationException"


class MissingParameter(CloudWatchError):
    code = "MissingParameter"
    shape = "MissingRequiredParameterException"


class InvalidNextToken(CloudWatchError):
    code = "InvalidNextToken"
    shape = "InvalidNextToken"


class CloudWatchValidationError(CloudWatchError):
    """CloudWatch's generic (unmodelled) validation error: GetMetricData's bad queries."""

    code = "ValidationError"
    shape = "ValidationError"


class InternalServiceError(CloudWatchError):
    code = "InternalServiceError"
    shape = "InternalServiceFault"
    status = 500
