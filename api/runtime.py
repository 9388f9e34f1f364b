"""sagemaker-runtime: InvokeEndpoint and InvokeEndpointWithResponseStream (rest-json).

SigV4 as for the control plane; errors take their code from `x-amzn-ErrorType` (botocore
reads it there for rest-json): ValidationError 400 for unknown endpoints and bad bodies,
ModelError 424 when the model server fails. Streaming replies are AWS event-stream frames
(`PayloadPart`; a mid-stream failure is a `ModelStreamError` exception frame).

A request goes to a variant by weight (or TargetVariant), then round-robin to one of that
variant's instances; an instance that refuses the connection is skipped for the next one
(the request never reached it) and a serve worker is asked to restart it.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import APIRouter, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse

from api import eventstream
from api.capture import CaptureWriter
from api.errors import ServiceError
from api.registry import Context
from api.runtime_bodies import (
    LMI,
    RuntimeValidationError,
    Translated,
    capture_record,
    chunk_text,
    completion_text,
    lmi_reply,
    translate,
)
from api.sigv4 import IncomingRequest, verify
from db.common import find
from db.tables import EndpointConfigRow, EndpointRow
from workers import queue as q
from workers.serving.deploy import instances_of
from workers.storage import make_store

log = logging.getLogger("eaglenest.runtime")
#: statuses that take requests: SystemUpdating restarts dead instances while the live ones
#: serve (SageMaker serves during its maintenance too)
SERVING = ("InService", "Updating", "SystemUpdating")


class ModelError(ServiceError):
    code = "ModelError"
    status = 424

    def __init__(self, message: str, original_status: int, original_message: str) -> None:
        super().__init__(message)
        self.original_status, self.original_message = original_status, original_message

    def body(self) -> dict[str, Any]:
        return {"message": self.message, "OriginalStatusCode": self.original_status,
                "OriginalMessage": self.original_message[:2000]}


def runtime_error(err: ServiceError) -> Response:
    body = err.body()
    body.pop("__type", None)
    return Response(json.dumps(body), status_code=err.status, media_type="application/json",
                    headers={"x-amzn-ErrorType": err.code, "x-amzn-RequestId": str(uuid.uuid4())})


class Route:
    def __init__(self, variant: str, urls: list[str], served: str,
                 capture: dict[str, Any] | None, status: str):
        #: the variant's instances, the one whose turn it is first
        self.variant, self.urls, self.served, self.capture = variant, urls, served, capture
        self.status = status


_turns: dict[tuple[str, str], itertools.count[int]] = {}
_turns_lock = threading.Lock()


def _rotation(name: str, variant: str, urls: list[str]) -> list[str]:
    """Round-robin over a variant's instances: each call starts one further along."""
    with _turns_lock:
        turn = next(_turns.setdefault((name, variant), itertools.count()))
    start = turn % len(urls)
    return urls[start:] + urls[:start]


def resolve(ctx: Context, name: str, target_variant: str | None) -> Route:
    with ctx.db.session() as s:
        row = find(s, EndpointRow, name)
        if row is None:
            raise RuntimeValidationError(
                f"Endpoint {name} of account {ctx.account.account_id} not found.")
        if row.status not in SERVING or not row.deployment.get("Servers"):
            raise RuntimeValidationError(
                f"Endpoint {name} is not in service (status {row.status}).")
        servers: dict[str, Any] = row.deployment["Servers"]
        status = row.status
        config = find(s, EndpointConfigRow, row.config_name)
        capture = config.spec.get("DataCaptureConfig") if config else None
    if target_variant:
        if target_variant not in servers:
            raise RuntimeValidationError(
                f"Target variant {target_variant} does not exist on endpoint {name}.")
        chosen = target_variant
    else:
        names = list(servers)
        weights = [float(servers[n].get("weight", 1.0)) for n in names]
        chosen = random.choices(names, weights=weights if sum(weights) > 0 else None)[0]
    srv = servers[chosen]
    urls = _rotation(name, chosen, [str(i["url"]) for i in instances_of(srv)])
    return Route(chosen, urls, srv.get("served_name", name), capture, status)


def _capture(capture: CaptureWriter, route: Route, endpoint: str, tr: Translated,
             text: str) -> None:
    cfg = route.capture
    if not cfg or not cfg.get("EnableCapture", True):
        return
    if random.uniform(0, 100) >= float(cfg.get("InitialSamplingPercentage", 100)):
        return
    capture.add(cfg["DestinationS3Uri"], endpoint, route.variant,
                capture_record(tr, text, endpoint, route.variant))


def _ask_recovery(ctx: Context, name: str, route: Route) -> None:
    """A model server did not answer: have a serve worker check and restart it (unless a
    recovery is already under way)."""
    if route.status != "SystemUpdating":
        ctx.queue.send(q.ENDPOINT_RECOVER_TASK, name, q.SERVE_QUEUE)


def _backend_failed(ctx: Context, name: str, route: Route, exc: Exception) -> ModelError:
    _ask_recovery(ctx, name, route)
    return ModelError(f"Received server error from model {route.variant}: the model server "
                      f"did not answer ({exc.__class__.__name__}).", 500, str(exc))


async def _send(ctx: Context, client: httpx.AsyncClient, route: Route, name: str,
                tr: Translated, stream: bool = False) -> httpx.Response:
    """POST to the route's instances in turn until one takes the connection; an instance
    that refused it never saw the request, so the next one may have it."""
    for url in route.urls[:-1]:
        try:
            return await client.send(client.build_request("POST", url + tr.path, json=tr.body),
                                     stream=stream)
        except httpx.ConnectError:
            _ask_recovery(ctx, name, route)
    return await client.send(client.build_request("POST", route.urls[-1] + tr.path,
                                                  json=tr.body), stream=stream)


async def _invoke(ctx: Context, capture: CaptureWriter, client: httpx.AsyncClient, request: Request,
                  name: str, raw: bytes) -> Response:
    route = await run_in_threadpool(
        resolve, ctx, name, request.headers.get("x-amzn-sagemaker-target-variant"))
    tr = translate(raw, route.served, stream=False)
    try:
        r = await _send(ctx, client, route, name, tr)
    except httpx.TransportError as exc:
        raise _backend_failed(ctx, name, route, exc) from exc
    if r.status_code != 200:
        raise ModelError(f"Received client error ({r.status_code}) from primary with message "
                         f"\"{r.text[:500]}\".", r.status_code, r.text)
    reply = r.json()
    _capture(capture, route, name, tr, completion_text(reply))
    out = lmi_reply(reply) if tr.style == LMI else reply
    headers = {"x-Amzn-Invoked-Production-Variant": route.variant,
               "x-amzn-RequestId": str(uuid.uuid4())}
    custom = request.headers.get("x-amzn-sagemaker-custom-attributes")
    if custom:
        headers["X-Amzn-SageMaker-Custom-Attributes"] = custom
    return Response(json.dumps(out), media_type="application/json", headers=headers)


async def _relay(r: httpx.Response, tr: Translated, parts: list[str]) -> AsyncIterator[bytes]:
    """The model server's SSE lines as event-stream payload parts (LMI: token JSON lines)."""
    async for line in r.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        piece = chunk_text(json.loads(line[6:]))
        parts.append(piece)
        if tr.style == LMI:
            if piece:
                tok = json.dumps({"token": {"text": piece}}) + "\n"
                yield eventstream.payload_part(tok.encode())
        else:
            yield eventstream.payload_part((line + "\n\n").encode())


async def _stream_frames(ctx: Context, capture: CaptureWriter, client: httpx.AsyncClient,
                         route: Route, name: str, tr: Translated) -> AsyncIterator[bytes]:
    parts: list[str] = []
    try:
        r = await _send(ctx, client, route, name, tr, stream=True)
        try:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                yield eventstream.model_stream_error(f"model returned {r.status_code}: {text}")
                return
            async for frame in _relay(r, tr, parts):
                yield frame
        finally:
            await r.aclose()
    except httpx.HTTPError as exc:
        if isinstance(exc, httpx.TransportError):
            _backend_failed(ctx, name, route, exc)
        yield eventstream.model_stream_error(f"model server failed mid-stream: {exc}")
        return
    if tr.style == LMI:
        final = json.dumps({"token": None, "generated_text": "".join(parts)}) + "\n"
        yield eventstream.payload_part(final.encode())
    _capture(capture, route, name, tr, "".join(parts))


def install(app: FastAPI, ctx: Context) -> None:
    router = APIRouter()
    secrets = ctx.settings.credentials()
    capture = CaptureWriter(make_store(ctx.settings), ctx.settings.capture_flush_seconds)
    client = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0))
    app.state.runtime_client = client
    app.state.capture = capture

    def auth(request: Request, body: bytes) -> None:
        headers = {k.lower(): v for k, v in request.headers.items()}
        verify(IncomingRequest(request.method, str(request.url), headers, body), secrets,
               ctx.settings.region, ctx.settings.signature_max_skew)

    @router.post("/endpoints/{name}/invocations")
    async def invocations(name: str, request: Request) -> Response:
        raw = await request.body()
        try:
            auth(request, raw)
            return await _invoke(ctx, capture, client, request, name, raw)
        except ServiceError as err:
            return runtime_error(err)

    @router.post("/endpoints/{name}/invocations-response-stream")
    async def stream(name: str, request: Request) -> Response:
        raw = await request.body()
        try:
            auth(request, raw)
            route = await run_in_threadpool(
                resolve, ctx, name, request.headers.get("x-amzn-sagemaker-target-variant"))
            tr = translate(raw, route.served, stream=True)
        except ServiceError as err:
            return runtime_error(err)
        headers = {"x-Amzn-Invoked-Production-Variant": route.variant,
                   "X-Amzn-SageMaker-Content-Type": "application/jsonlines"
                   if tr.style == LMI else "text/event-stream"}
        return StreamingResponse(_stream_frames(ctx, capture, client, route, name, tr),
                                 media_type="application/vnd.amazon.eventstream",
                                 headers=headers)

    app.include_router(router)
