"""CloudWatch's wire: Smithy RPC v2 CBOR, as botocore speaks it (botocore/serialize.py
`RpcV2CBORSerializer`, botocore/parsers.py `RpcV2CBORParser`; service model protocol
"smithy-rpc-v2-cbor").

Request: `POST /service/GraniteServiceVersion20100801/operation/<Op>`, a CBOR map of the
operation's input members (timestamps as tag 1, epoch seconds), SigV4 signing name
`monitoring`. Reply: 200 and a CBOR map of the output members, `content-type:
application/cbor`, `smithy-protocol: rpc-v2-cbor`; timestamps are written as tag 1 too.

Errors: the body is `{"__type": "<namespace>#<shape>", "message": ...}` and, since
CloudWatch's model is awsQueryCompatible, the `x-amzn-query-error: <code>;Sender|Receiver`
header carries the query-protocol code botocore reports as the ClientError's code (for
example `InvalidParameterValue` for the shape InvalidParameterValueException). The edge's
own errors (signatures, unknown keys, the database down) keep the codes every other plane
gives them (InvalidSignatureException, UnrecognizedClientException, ...), as CloudWatch's
JSON 1.0 plane (api/edge/json_protocol.py) reports them.

Decoding is bounded: at most `MAX_BODY` bytes are read (api.edge.bounded.read_signed),
nesting at most `MAX_DEPTH` deep, and only the plain values the shapes take (maps with
text keys, arrays, text, numbers, booleans, null, tag-1 timestamps): any other tag
(shared values, whose cycles could loop a validator; sets; bignums) is a
SerializationException.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import cbor2

from eaglenest.foundation.errors import CloudWatchError, SerializationException, ServiceError
from eaglenest.foundation.http.asgi import WholeReply, amzn_request_id

CBOR = b"application/cbor"
#: the Smithy namespace of CloudWatch's error shapes
NAMESPACE = "com.amazonaws.cloudwatch"
PROTOCOL = (b"smithy-protocol", b"rpc-v2-cbor")
#: CloudWatch requests are small (a GetMetricData of 500 queries is ~100 KB)
MAX_BODY = 1024 * 1024
MAX_DEPTH = 32
_PLAIN = (str, int, float, bool, datetime, type(None))


class RequestEntityTooLarge(CloudWatchError):
    """A body over MAX_BODY: 413, before more of it is read."""

    code = "RequestEntityTooLarge"
    shape = "RequestEntityTooLarge"
    status = 413


def too_large() -> RequestEntityTooLarge:
    return RequestEntityTooLarge(f"Request size exceeded {MAX_BODY} bytes.")


def _checked(value: Any, depth: int) -> None:
    """SerializationException unless `value` holds only plain values, `depth` levels deep
    at most (a shared value's cycle ends here too)."""
    if depth > MAX_DEPTH:
        raise SerializationException(f"Request body nests CBOR deeper than {MAX_DEPTH} levels.")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise SerializationException("Request body has a map key that is not text.")
            _checked(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _checked(item, depth + 1)
    elif not isinstance(value, _PLAIN):
        raise SerializationException(
            f"Request body holds a CBOR value of type {type(value).__name__}, which no member "
            "of CloudWatch's shapes takes.")


def decode(body: bytes) -> dict[str, Any]:
    """The request's members (an empty body is an empty input)."""
    if not body:
        return {}
    try:
        payload = cbor2.loads(body, max_depth=MAX_DEPTH + 2, allow_duplicate_keys=False)
    except (cbor2.CBORError, ValueError, OverflowError, RecursionError) as exc:
        raise SerializationException("Request body is not valid CBOR.") from exc
    if not isinstance(payload, dict):
        raise SerializationException("Request body must be a CBOR map.")
    _checked(payload, 0)
    return payload


def encode(data: dict[str, Any]) -> bytes:
    """A reply's CBOR: datetimes as tag 1 epoch seconds."""
    return bytes(cbor2.dumps(data, datetime_as_timestamp=True))


def cbor_reply(data: dict[str, Any], status: int = 200,
               headers: tuple[tuple[bytes, bytes], ...] = ()) -> WholeReply:
    """A whole reply (foundation.http.asgi.reply writes it)."""
    return WholeReply(status, encode(data), CBOR, [PROTOCOL, amzn_request_id(), *headers])


def error_reply(err: ServiceError) -> WholeReply:
    """`err` as CloudWatch reports it: `__type` + message, and the x-amzn-query-error
    header botocore reads the code from."""
    if isinstance(err, CloudWatchError):
        body = {"__type": f"{NAMESPACE}#{err.shape}", "message": err.message}
        query = err.query_error()
    else:
        body = {"__type": err.code, "message": err.message}
        fault = "Receiver" if err.status >= 500 else "Sender"
        query = f"{err.code};{fault}"
    return cbor_reply(body, err.status, ((b"x-amzn-query-error", query.encode()),))
