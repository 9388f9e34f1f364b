"""AWS JSON 1.1 on `POST /`: SigV4 check, X-Amz-Target dispatch to the services of SERVICES
(SageMaker's operations, api/sagemaker/; the Resource Groups Tagging API's, api/tagging/;
CloudWatch's reads in AWS JSON 1.0, api/cloudwatch/),
AWS error rendering; and `GET /metrics` (api/observability.py: a bearer token, or loopback
only)."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4
from sqlalchemy.exc import OperationalError

from eaglenest.api import cloudwatch, sagemaker, tagging
from eaglenest.api.edge.bounded import BodyLimit, check_depth, read_signed, too_large
from eaglenest.api.edge.keyring import KeyRing
from eaglenest.api.edge.registry import Context, JsonService
from eaglenest.api.edge.sigv4 import REQUIRED_JSON, SignedRequest
from eaglenest.api.observability import (
    ApiMetrics,
    BrokerProbe,
    checked_token,
    scrape_refusal,
)
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.errors import (
    InternalFailure,
    SerializationException,
    ServiceError,
    ServiceUnavailable,
    UnknownOperationException,
)
from eaglenest.foundation.http.asgi import WholeReply, amzn_request_id

log = logging.getLogger("eaglenest.api")
#: every AWS JSON service served on `POST /` (a new one: its folder under api/ and one entry)
SERVICES: tuple[JsonService, ...] = (sagemaker.SERVICE, tagging.SERVICE, cloudwatch.SERVICE)
JSON_11 = "application/x-amz-json-1.1"


def json_response(body: dict[str, Any], status: int = 200) -> Response:
    """The reply, written by the writer of every plane (foundation.http.asgi.reply)."""
    # The request id is set here rather than by an HTTP middleware: Starlette's
    # BaseHTTPMiddleware costs more per call than the whole operation on a small request.
    return WholeReply(status, json.dumps(body, separators=(",", ":")).encode(),
                      JSON_11.encode(), [amzn_request_id()])


def error_response(err: ServiceError) -> Response:
    return json_response(err.body(), err.status)


async def authenticated_body(request: Request, ctx: Context, secrets: Mapping[str, str],
                             service: str = "sagemaker") -> tuple[bytes, str]:
    """The body of a request whose signature is valid, and its access key id
    (api.edge.bounded.read_signed, at most `max_request_bytes`)."""
    settings, limit = ctx.settings, ctx.settings.max_request_bytes
    body, verified = await read_signed(
        SignedRequest.of(request.scope), request.stream(),
        BodyLimit(limit, lambda: too_large(limit)), secrets, settings.region,
        settings.signature_max_skew, service, REQUIRED_JSON)
    return body, verified.access_key


def route(target: str) -> tuple[JsonService, str | None]:
    """The service an X-Amz-Target names and its operation; SageMaker and None when the
    target names no operation we serve."""
    for service in SERVICES:
        op = service.operation_of(target)
        if op is not None:
            return service, op
    return SERVICES[0], None


def label(service: JsonService, op: str | None) -> str:
    """The operation's label in the metrics: `<Op>`, `tagging:<Op>`, or `Unknown`."""
    return service.label_prefix + op if op is not None else "Unknown"


def _not_json(token: str) -> Any:
    """Python's json reads NaN / Infinity / -Infinity; JSON (and botocore) has no such thing."""
    raise ValueError(f"{token} is not a JSON value")


def _finite(text: str) -> float:
    """A JSON number too large for a double (1e400) would become inf: refuse it as well."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {text[:32]}")
    return value


def _payload(body: bytes) -> dict[str, Any]:
    check_depth(body)
    try:
        payload = json.loads(body or b"{}", parse_constant=_not_json, parse_float=_finite)
    except ValueError as exc:
        raise SerializationException("Request body is not valid JSON.") from exc
    if not isinstance(payload, dict):
        raise SerializationException("Request body must be a JSON object.")
    return payload


def dispatch(ctx: Context, target: str, body: bytes) -> dict[str, Any]:
    """Run one control-plane operation; raise ServiceError for every failure."""
    service, op = route(target)
    if op is None:
        raise UnknownOperationException(f"Operation '{target}' is not supported by EagleNest.")
    payload = _payload(body)
    try:
        return service.call(ctx, op, payload)
    except OperationalError as exc:
        log.warning("database unavailable during %s: %s", op, exc.orig)
        raise ServiceUnavailable("The database is unavailable; retry the request.") from exc


def install(app: FastAPI, ctx: Context) -> None:
    router = APIRouter()
    app.state.broker = BrokerProbe(ctx.queue.broker_up)
    # the app's one ApiMetrics (the runtime's too); its MetricBuffer is started and closed
    # by the app's lifespan (api/app.py)
    metrics = ApiMetrics.build(ctx.settings, ctx.db, app.state.broker)
    app.state.metrics = metrics
    keyring = KeyRing(ctx.settings)  # re-read when `eaglenest keys` changes the file
    metrics_token = checked_token(ctx.settings.metrics_token)  # a bad one: no API at all

    @router.post("/")
    async def aws_json(request: Request) -> Response:
        start = time.perf_counter()
        target = request.headers.get("x-amz-target", "")
        service, found = route(target)
        op = label(service, found)
        try:
            keys = keyring.current()
            secrets = {k: v.secret for k, v in keys.items()}
            body, key = await authenticated_body(request, ctx, secrets,
                                                 service.signing_name)
            # the operation acts for the account of the key that signed it
            caller = replace(ctx, account=Account(ctx.settings.region, keys[key].account_id))
            result = await run_in_threadpool(dispatch, caller, target, body)
        except ServiceError as err:
            metrics.observe(op, err.code, time.perf_counter() - start)
            raise
        metrics.observe(op, "OK", time.perf_counter() - start)
        return json_response(result)

    @router.get("/metrics")
    async def prometheus(request: Request) -> Response:
        # every account's series: a bearer token or, without one, loopback only
        client = request.client.host if request.client else None
        refused = scrape_refusal(metrics_token, client, request.headers)
        if refused is not None:
            return PlainTextResponse(refused.message + "\n", refused.status, refused.headers)
        text = await run_in_threadpool(metrics.render)  # reads the database
        return Response(text, media_type=CONTENT_TYPE_PLAIN_0_0_4)

    app.include_router(router)

    @app.exception_handler(ServiceError)
    async def service_error(_: Request, exc: ServiceError) -> Response:
        return error_response(exc)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return error_response(InternalFailure("An internal error occurred."))
