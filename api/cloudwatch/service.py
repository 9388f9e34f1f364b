"""CloudWatch's operations: SigV4 signing name `monitoring`, shapes in
foundation/shapes/cloudwatch.py (generated from botocore's model), handlers registered with
`operation` in the registry of the JSON services (api/edge/registry.py checks that each
takes its generated input class and returns its output class).

CloudWatch speaks two protocols here, with the same handlers: AWS JSON 1.0 on `POST /`
(`X-Amz-Target: GraniteServiceVersion20100801.<Op>`, what botocore picks from the model's
protocols: boto3 and the AWS CLI), dispatched by api/edge/json_protocol.py like SageMaker's
operations, and Smithy RPC v2 CBOR on its own path (api/cloudwatch/__init__.py, `call_cbor`).
A request that breaks its operation's shape is CloudWatch's InvalidParameterValue, with the
message naming the member."""

from __future__ import annotations

from typing import Any

from eaglenest.api.edge.registry import Context, JsonService
from eaglenest.foundation.errors import InvalidParameterValue, UnknownOperationException
from eaglenest.foundation.shapes import AwsShape

#: the signing name, and the model's targetPrefix (the JSON target's prefix, and the service
#: segment of the CBOR path)
SIGNING_NAME = "monitoring"
TARGET = "GraniteServiceVersion20100801"
SERVICE = JsonService(signing_name=SIGNING_NAME, target_prefix=f"{TARGET}.",
                      label_prefix="cloudwatch:", invalid_request=InvalidParameterValue)
operation = SERVICE.operation


def call_cbor(ctx: Context, op: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Run operation `op` on the decoded CBOR members: the reply's members with datetimes
    kept (the CBOR wire writes them as timestamps, JSON as epoch numbers)."""
    if op not in SERVICE.handlers:
        raise UnknownOperationException(
            f"Operation {op} is not supported by EagleNest's CloudWatch (GetMetricStatistics, "
            "GetMetricData, ListMetrics).")
    shape: type[AwsShape] = SERVICE.outputs[op] or AwsShape
    # the JSON reply as every plane checks it, read back into its shape for its datetimes
    out: dict[str, Any] = shape.model_validate(SERVICE.call(ctx, op, payload)).model_dump(
        mode="python", exclude_none=True, by_alias=True)
    return out
