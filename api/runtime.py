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
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse

from api import eventstream
from api.backend_http import BackendClient, BackendConnectError, BackendError, BackendResponse
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
                 capture: dict[str, Any] | None, status: str, cached: bool = False):
        #: the variant's instances, the one whose turn it is first
        self.variant, self.urls, self.served, self.capture = variant, urls, served, capture
        self.status, self.cached = status, cached


class _Snapshot:
    """What an invocation needs from an endpoint's rows, read in one session."""

    def __init__(self, servers: dict[str, Any], status: str,
                 capture: dict[str, Any] | None, expires: float) -> None:
        self.servers, self.status, self.capture = servers, status, capture
        self.expires = expires


_turns: dict[tuple[str, str], itertools.count[int]] = {}
_turns_lock = threading.Lock()


def _rotation(name: str, variant: str, urls: list[str]) -> list[str]:
    """Round-robin over a variant's instances: each call starts one further along."""
    with _turns_lock:
        turn = next(_turns.setdefault((name, variant), itertools.count()))
    start = turn % len(urls)
    return urls[start:] + urls[:start]


def _load(ctx: Context, name: str, ttl: float) -> _Snapshot:
    with ctx.db.session() as s:
        row = find(s, EndpointRow, name)
        if row is None:
            raise RuntimeValidationError(
                f"Endpoint {name} of account {ctx.account.account_id} not found.")
        if row.status not in SERVING or not row.deployment.get("Servers"):
            raise RuntimeValidationError(
                f"Endpoint {name} is not in service (status {row.status}).")
        config = find(s, EndpointConfigRow, row.config_name)
        capture = config.spec.get("DataCaptureConfig") if config else None
        return _Snapshot(dict(row.deployment["Servers"]), row.status, capture,
                         time.monotonic() + ttl)


class Routes:
    """Endpoint name -> its serving snapshot, read from the database at most every `ttl`
    seconds (a thread hop and two queries per invocation otherwise); `fresh=True` (after an
    instance refused a connection) reads it again."""

    def __init__(self, ctx: Context, ttl: float) -> None:
        self.ctx, self.ttl = ctx, ttl
        self._snapshots: dict[str, _Snapshot] = {}

    async def resolve(self, name: str, target_variant: str | None,
                      fresh: bool = False) -> Route:
        snap = self._snapshots.get(name)
        cached = not fresh and snap is not None and snap.expires > time.monotonic()
        if not cached:
            self._snapshots.pop(name, None)
            snap = await run_in_threadpool(_load, self.ctx, name, self.ttl)
            if self.ttl > 0:
                self._snapshots[name] = snap
        assert snap is not None
        return _choose(name, snap, target_variant, cached)


def _choose(name: str, snap: _Snapshot, target_variant: str | None, cached: bool) -> Route:
    servers = snap.servers
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
    return Route(chosen, urls, srv.get("served_name", name), snap.capture, snap.status,
                 cached)


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


async def _send(ctx: Context, client: BackendClient, route: Route, name: str,
                tr: Translated) -> BackendResponse:
    """POST to the route's instances in turn until one takes the connection; an instance
    that refused it never saw the request, so the next one may have it."""
    for url in route.urls[:-1]:
        try:
            return await client.post(url + tr.path, tr.body)
        except BackendConnectError:
            _ask_recovery(ctx, name, route)
    return await client.post(route.urls[-1] + tr.path, tr.body)


class Proxy:
    """What every invocation shares: context, routes, the backend client, capture."""

    def __init__(self, ctx: Context, routes: Routes, client: BackendClient,
                 capture: CaptureWriter) -> None:
        self.ctx, self.routes, self.client, self.capture = ctx, routes, client, capture

    async def open(self, request: Request, name: str, raw: bytes,
                   stream: bool) -> tuple[Route, Translated, BackendResponse]:
        """Resolve the route, translate the body, send it; returns once the model server
        answered with its status line. A cached route whose instance refused the
        connection is read again from the database (the instance was replaced) and the
        request goes out once more on the fresh one."""
        target_variant = request.headers.get("x-amzn-sagemaker-target-variant")
        route = await self.routes.resolve(name, target_variant)
        tr = translate(raw, route.served, stream=stream)
        try:
            if route.cached:
                try:
                    return route, tr, await self.client.post(route.urls[0] + tr.path, tr.body)
                except BackendConnectError:
                    _ask_recovery(self.ctx, name, route)  # as _send does for a refusal
                    route = await self.routes.resolve(name, target_variant, fresh=True)
                    tr = translate(raw, route.served, stream=stream)
            return route, tr, await _send(self.ctx, self.client, route, name, tr)
        except BackendError as exc:
            raise _backend_failed(self.ctx, name, route, exc) from exc


async def _read(px: Proxy, name: str, route: Route, r: BackendResponse) -> bytes:
    try:
        return await r.aread()
    except BackendError as exc:
        raise _backend_failed(px.ctx, name, route, exc) from exc


def _client_error(status: int, body: bytes) -> ModelError:
    text = body.decode(errors="replace")
    return ModelError(f"Received client error ({status}) from primary with message "
                      f"\"{text[:500]}\".", status, text)


def _reply_headers(request: Request, route: Route) -> dict[str, str]:
    headers = {"x-Amzn-Invoked-Production-Variant": route.variant}
    custom = request.headers.get("x-amzn-sagemaker-custom-attributes")
    if custom:
        headers["X-Amzn-SageMaker-Custom-Attributes"] = custom
    return headers


async def _invoke(px: Proxy, request: Request, name: str, raw: bytes) -> Response:
    route, tr, r = await px.open(request, name, raw, stream=False)
    body = await _read(px, name, route, r)
    if r.status_code != 200:
        raise _client_error(r.status_code, body)
    reply = json.loads(body)
    _capture(px.capture, route, name, tr, completion_text(reply))
    out = lmi_reply(reply) if tr.style == LMI else reply
    headers = {**_reply_headers(request, route), "x-amzn-RequestId": str(uuid.uuid4())}
    return Response(json.dumps(out), media_type="application/json", headers=headers)


async def _relay(r: BackendResponse, tr: Translated, parts: list[str]) -> AsyncIterator[bytes]:
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


async def _stream_frames(px: Proxy, route: Route, name: str, tr: Translated,
                         r: BackendResponse) -> AsyncIterator[bytes]:
    parts: list[str] = []
    try:
        async for frame in _relay(r, tr, parts):
            yield frame
    except BackendError as exc:
        _backend_failed(px.ctx, name, route, exc)
        yield eventstream.model_stream_error(f"model server failed mid-stream: {exc}")
        return
    finally:
        await r.aclose()
    if tr.style == LMI:
        final = json.dumps({"token": None, "generated_text": "".join(parts)}) + "\n"
        yield eventstream.payload_part(final.encode())
    _capture(px.capture, route, name, tr, "".join(parts))


async def _open_stream(px: Proxy, request: Request, name: str, raw: bytes) -> Response:
    """The model server's answer is awaited before replying, so a model server that is
    down or refuses the request is a ModelError (424) like InvokeEndpoint's; a failure
    after the first byte is a ModelStreamError frame in the stream."""
    route, tr, r = await px.open(request, name, raw, stream=True)
    if r.status_code != 200:
        raise _client_error(r.status_code, await _read(px, name, route, r))
    headers = {**_reply_headers(request, route),
               "X-Amzn-SageMaker-Content-Type": "application/jsonlines"
               if tr.style == LMI else "text/event-stream"}
    return StreamingResponse(_stream_frames(px, route, name, tr, r),
                             media_type="application/vnd.amazon.eventstream", headers=headers)


def install(app: FastAPI, ctx: Context) -> None:
    router = APIRouter()
    secrets = ctx.settings.credentials()
    px = Proxy(ctx, Routes(ctx, ctx.settings.route_cache_seconds),
               BackendClient(connect_timeout=5.0, read_timeout=600.0),
               CaptureWriter(make_store(ctx.settings), ctx.settings.capture_flush_seconds))
    app.state.runtime_client = px.client
    app.state.capture = px.capture

    def auth(request: Request, body: bytes) -> None:
        headers = {k.lower(): v for k, v in request.headers.items()}
        verify(IncomingRequest(request.method, str(request.url), headers, body), secrets,
               ctx.settings.region, ctx.settings.signature_max_skew)

    @router.post("/endpoints/{name}/invocations")
    async def invocations(name: str, request: Request) -> Response:
        raw = await request.body()
        try:
            auth(request, raw)
            return await _invoke(px, request, name, raw)
        except ServiceError as err:
            return runtime_error(err)

    @router.post("/endpoints/{name}/invocations-response-stream")
    async def stream(name: str, request: Request) -> Response:
        raw = await request.body()
        try:
            auth(request, raw)
            return await _open_stream(px, request, name, raw)
        except ServiceError as err:
            return runtime_error(err)

    app.include_router(router)
