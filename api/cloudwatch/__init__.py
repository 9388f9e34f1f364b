"""CloudWatch's read operations (GetMetricStatistics, GetMetricData, ListMetrics) over the
metric store (db/metrics_repo.py), SigV4-signed like every other service, for the account
of the key that signed the request.

    POST /  X-Amz-Target: GraniteServiceVersion20100801.<Op>      (AWS JSON 1.0)
    POST /service/GraniteServiceVersion20100801/operation/<Op>     (Smithy RPC v2 CBOR)

botocore (boto3, the AWS CLI) picks JSON 1.0 from the model's protocols; it is dispatched by
api/edge/json_protocol.py with `SERVICE` (api/cloudwatch/service.py). This module mounts the
CBOR route, whose wire is api/cloudwatch/wire.py; its requests are counted in the API's
metrics like the JSON planes' (label `cloudwatch:<Op>`). One module per operation
(metric_statistics.py, metric_data.py, list_metrics.py) serves both. The awsQuery protocol
(form posts of older SDKs) is not served."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from sqlalchemy.exc import OperationalError
from starlette.concurrency import run_in_threadpool

from eaglenest.api.cloudwatch import list_metrics, metric_data, metric_statistics, wire
from eaglenest.api.cloudwatch.service import SERVICE, SIGNING_NAME, TARGET, call_cbor
from eaglenest.api.edge.bounded import BodyLimit, read_signed
from eaglenest.api.edge.keyring import KeyRing
from eaglenest.api.edge.registry import Context
from eaglenest.api.edge.sigv4 import REQUIRED, SignedRequest
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.errors import (
    InternalServiceError,
    ServiceError,
    ServiceUnavailable,
)

__all__ = ["PATH", "SERVICE", "install", "list_metrics", "metric_data",
           "metric_statistics"]

log = logging.getLogger("eaglenest.api")
PATH = f"/service/{TARGET}/operation/"
#: headers a CloudWatch request must sign: the operation is in the (signed) path, the
#: body's type in Content-Type
REQUIRED_CBOR = (*REQUIRED, "content-type")


async def _caller(request: Request, ctx: Context, keyring: KeyRing) -> tuple[Context, bytes]:
    """The context acting for the account whose key signed the request, and its body."""
    keys = keyring.current()
    secrets = {k: v.secret for k, v in keys.items()}
    settings = ctx.settings
    body, verified = await read_signed(
        SignedRequest.of(request.scope), request.stream(),
        BodyLimit(wire.MAX_BODY, wire.too_large), secrets, settings.region,
        settings.signature_max_skew, SIGNING_NAME, REQUIRED_CBOR)
    account = Account(settings.region, keys[verified.access_key].account_id)
    return replace(ctx, account=account), body


def _dispatch(ctx: Context, op: str, payload: dict[str, Any]) -> dict[str, Any]:
    try:
        return call_cbor(ctx, op, payload)
    except OperationalError as exc:
        log.warning("database unavailable during CloudWatch %s: %s", op, exc.orig)
        raise ServiceUnavailable("The database is unavailable; retry the request.") from exc


def install(app: FastAPI, ctx: Context) -> None:
    """Mount CloudWatch's route on `app`."""
    keyring = KeyRing(ctx.settings)  # re-read when `eaglenest keys` changes the file

    metrics = app.state.metrics  # json_protocol.install made it (api/app.py MOUNTS)

    @app.post(PATH + "{op}")
    async def cloudwatch(request: Request, op: str) -> Response:
        start = time.perf_counter()
        label = SERVICE.label_prefix + op if op in SERVICE.handlers else "Unknown"
        try:
            caller, body = await _caller(request, ctx, keyring)
            result = await run_in_threadpool(_dispatch, caller, op, wire.decode(body))
        except Exception as exc:  # every reply of this route is CBOR, a bug's too
            err = exc if isinstance(exc, ServiceError) else InternalServiceError(
                "An internal error occurred.")
            if err is not exc:
                log.exception("unhandled error in CloudWatch %s", op, exc_info=exc)
            metrics.observe(label, err.code, time.perf_counter() - start)
            return wire.error_reply(err)
        metrics.observe(label, "OK", time.perf_counter() - start)
        return wire.cbor_reply(result)
