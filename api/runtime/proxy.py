"""sagemaker-runtime: InvokeEndpoint and InvokeEndpointWithResponseStream (rest-json).

SigV4 as for the control plane; errors take their code from `x-amzn-ErrorType` (botocore
reads it there for rest-json): ValidationError 400 only for what SageMaker itself checks
(the endpoint exists and serves, header formats, body size: api.runtime.checks), ModelError
424 whenever the container answers non-2xx or not at all, a body it does not understand
included (OriginalStatusCode, OriginalMessage, LogStreamArn). Streaming replies are AWS
event-stream frames (`PayloadPart`; a mid-stream failure is a `ModelStreamError` exception
frame).

The two routes are served by a plain ASGI layer ahead of FastAPI's router (`RuntimeASGI`):
every streamed token costs one read from the model server and one frame to the caller, and
FastAPI's request and StreamingResponse machinery (a task group, a disconnect listener and
three send wrappers per frame) cost about as much again. Streamed frames are written from
the socket callback that read the token (`relay`), not by a task woken for it.
A caller that goes away mid-stream closes the model server's connection, which stops its
generation.

Routing (variant by weight or TargetVariant, round-robin over instances, the route cache)
is in `routes`; an instance that refuses the connection is skipped for the next
one (the request never reached it) and a serve worker is asked to restart it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from eaglenest.api.edge.bounded import BodyLimit, read_signed
from eaglenest.api.edge.keyring import KeyRing
from eaglenest.api.edge.registry import Context
from eaglenest.api.edge.sigv4 import SignedRequest
from eaglenest.api.observability import ApiMetrics
from eaglenest.api.runtime import disk_quota, eventstream
from eaglenest.api.runtime.bodies import (
    LMI,
    ContainerRejected,
    Translated,
    capture_record,
    completion_text,
    lmi_reply,
    translate,
)
from eaglenest.api.runtime.capture import CaptureWriter
from eaglenest.api.runtime.checks import MAX_BODY, body_too_large, check_request
from eaglenest.api.runtime.metering import Clock, invocation
from eaglenest.api.runtime.relay import FrameRelay
from eaglenest.api.runtime.routes import Route, Routes
from eaglenest.foundation import queue as q
from eaglenest.foundation.accounts import ResourceRef
from eaglenest.foundation.errors import ServiceError
from eaglenest.foundation.http.asgi import amzn_request_id, body_chunks, reply, start
from eaglenest.foundation.http.backend_client import (
    BackendClient,
    BackendConnectError,
    BackendError,
    BackendResponse,
)
from eaglenest.foundation.store.storage import make_store

log = logging.getLogger("eaglenest.runtime")
Headers = list[tuple[bytes, bytes]]
EVENTSTREAM = b"application/vnd.amazon.eventstream"


class ModelError(ServiceError):
    """The model container failed: HTTP 424 with the container's status and body, and where
    its logs are (`LogStreamArn`: the endpoint's log group, as SageMaker names it)."""

    code = "ModelError"
    status = 424

    def __init__(self, message: str, original_status: int, original_message: str,
                 log_stream_arn: str | None = None) -> None:
        super().__init__(message)
        self.original_status, self.original_message = original_status, original_message
        self.log_stream_arn = log_stream_arn

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"message": self.message,
                               "OriginalStatusCode": self.original_status,
                               "OriginalMessage": self.original_message[:2000]}
        if self.log_stream_arn:
            out["LogStreamArn"] = self.log_stream_arn
        return out


def container_error(ctx: Context, name: str, status: int, text: str,
                    arn: str = "") -> ModelError:
    """SageMaker's ModelError for a container's non-2xx answer from endpoint `arn` (default:
    `name` of the context's account). The log group is named as SageMaker's; here the model
    servers' logs are the files under `endpoints/<account>/<name>/` in the data directory."""
    ref = ResourceRef.parse(arn)
    account = ref.account_id if ref else ctx.account.account_id
    group = f"/aws/sagemaker/Endpoints/{name}"
    kind = "client" if 400 <= status < 500 else "server"
    return ModelError(
        f'Received {kind} error ({status}) from primary with message "{text[:500]}". '
        f"See the log group {group} (model server logs: endpoints/{account}/"
        f"{ref.name if ref else name.lower()}/ in the EagleNest data directory) in account "
        f"{account} for more information.",
        status, text, f"arn:aws:logs:{ctx.account.region}:{account}:log-group:{group}")


async def _reply(send: Send, status: int, body: bytes, content_type: bytes,
                 headers: Headers) -> None:
    await reply(send, status, body, content_type, [amzn_request_id(), *headers])


async def _error_reply(send: Send, err: ServiceError) -> None:
    body = err.body()
    body.pop("__type", None)
    await _reply(send, err.status, json.dumps(body).encode(), b"application/json",
                 [(b"x-amzn-errortype", err.code.encode())])


def _sampled(route: Route) -> bool:
    """Whether Data Capture keeps this request (decided up front: a stream that is not
    captured and not LMI relays the model server's lines without parsing them)."""
    cfg = route.capture
    if not cfg or not cfg.get("EnableCapture", True):
        return False
    return random.uniform(0, 100) < float(cfg.get("InitialSamplingPercentage", 100))


def _capture(px: Proxy, route: Route, endpoint: str, tr: Translated, text: str,
             account_id: str) -> None:
    """Capture for the endpoint's account (`account_id`: only its own endpoints resolve)."""
    assert route.capture is not None
    px.capture.add(route.capture["DestinationS3Uri"], endpoint, route.variant,
                   capture_record(tr, text, endpoint, route.variant), account_id,
                   arn=route.arn)


def _ask_recovery(ctx: Context, name: str, route: Route) -> None:
    """A model server did not answer: have a serve worker check and restart it (unless a
    recovery is already under way)."""
    if route.status != "SystemUpdating":
        ctx.queue.send(q.ENDPOINT_RECOVER_TASK, route.arn, q.SERVE_QUEUE)


def _backend_failed(ctx: Context, name: str, route: Route, exc: Exception) -> ModelError:
    _ask_recovery(ctx, name, route)
    return container_error(ctx, name, 500, f"The model server of variant {route.variant} did "
                                           f"not answer ({exc.__class__.__name__}: {exc}).",
                           route.arn)


async def _send(ctx: Context, client: BackendClient, route: Route, name: str,
                tr: Translated) -> BackendResponse:
    """POST to the route's instances in turn until one takes the connection; an instance
    that refused it never saw the request, so the next one may have it."""
    for url in route.urls[:-1]:
        try:
            return await client.post(url + tr.path, tr.body, route.secrets.get(url))
        except BackendConnectError:
            _ask_recovery(ctx, name, route)
    last = route.urls[-1]
    return await client.post(last + tr.path, tr.body, route.secrets.get(last))


class Proxy:
    """What every invocation shares: context, routes, the backend client, capture."""

    def __init__(self, ctx: Context, routes: Routes, client: BackendClient,
                 capture: CaptureWriter) -> None:
        self.ctx, self.routes, self.client, self.capture = ctx, routes, client, capture

    async def open(self, headers: Mapping[str, str], name: str, raw: bytes,
                   stream: bool, account_id: str,
                   clock: Clock) -> tuple[Route, Translated, BackendResponse]:
        """Resolve the route (`clock.route`), translate the body, send it; returns once the
        model server answered with its status line. A cached route whose instance refused
        the connection is read again from the database (the instance was replaced) and the
        request goes out once more on the fresh one."""
        target_variant = headers.get("x-amzn-sagemaker-target-variant")
        route = clock.route = await self.routes.resolve(name, target_variant,
                                                        account_id=account_id)
        tr = self._translate(name, raw, route, stream, headers)
        try:
            if route.cached:
                try:
                    first = route.urls[0]
                    return route, tr, await self.client.post(first + tr.path, tr.body,
                                                             route.secrets.get(first))
                except BackendConnectError:
                    _ask_recovery(self.ctx, name, route)  # as _send does for a refusal
                    route = clock.route = await self.routes.resolve(
                        name, target_variant, fresh=True, account_id=account_id)
                    tr = self._translate(name, raw, route, stream, headers)
            return route, tr, await _send(self.ctx, self.client, route, name, tr)
        except BackendError as exc:
            raise _backend_failed(self.ctx, name, route, exc) from exc


    def _translate(self, name: str, raw: bytes, route: Route, stream: bool,
                   headers: Mapping[str, str]) -> Translated:
        try:
            return translate(raw, route.served, stream, headers.get("content-type"))
        except ContainerRejected as exc:  # the container's 4xx, as SageMaker reports it
            raise container_error(self.ctx, name, exc.status, exc.body, route.arn) from None


async def _read(px: Proxy, name: str, route: Route, r: BackendResponse) -> bytes:
    try:
        return await r.aread()
    except BackendError as exc:
        raise _backend_failed(px.ctx, name, route, exc) from exc



def _reply_headers(headers: Mapping[str, str], route: Route) -> Headers:
    out = [(b"x-amzn-invoked-production-variant", route.variant.encode())]
    custom = headers.get("x-amzn-sagemaker-custom-attributes")
    if custom:
        out.append((b"x-amzn-sagemaker-custom-attributes", custom.encode()))
    return out


async def _invoke(px: Proxy, send: Send, headers: Mapping[str, str], name: str,
                  raw: bytes, clock: Clock, account_id: str) -> None:
    route, tr, r = await px.open(headers, name, raw, False, account_id, clock)
    clock.sent(r)
    body = await _read(px, name, route, r)
    clock.answered(r)
    if not 200 <= r.status_code < 300:
        raise container_error(px.ctx, name, r.status_code, body.decode(errors="replace"),
                              route.arn)
    reply = json.loads(body)
    if _sampled(route):
        _capture(px, route, name, tr, completion_text(reply), account_id)
    out = lmi_reply(reply) if tr.style == LMI else reply
    await _reply(send, 200, json.dumps(out).encode(), b"application/json",
                 _reply_headers(headers, route))
    clock.relayed(r)


async def _watch_disconnect(receive: Receive, r: BackendResponse, gone: list[bool]) -> None:
    """The caller went away: close the model server's connection (it stops generating)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.append(True)
    r.close()


async def _stream(px: Proxy, receive: Receive, send: Send,
                  headers: Mapping[str, str], name: str, raw: bytes, clock: Clock,
                  account_id: str) -> None:
    """The model server's answer is awaited before replying, so a model server that is
    down or refuses the request is a ModelError (424) like InvokeEndpoint's; a failure
    after the first byte is a ModelStreamError frame in the stream."""
    route, tr, r = await px.open(headers, name, raw, True, account_id, clock)
    clock.sent(r)
    if not 200 <= r.status_code < 300:
        body = await _read(px, name, route, r)
        clock.answered(r)
        raise container_error(px.ctx, name, r.status_code, body.decode(errors="replace"),
                              route.arn)
    captured = _sampled(route)
    parts: list[str] | None = [] if captured or tr.style == LMI else None
    await start(send, 200, EVENTSTREAM, None, [
        amzn_request_id(), *_reply_headers(headers, route),
        (b"x-amzn-sagemaker-content-type",
         b"application/jsonlines" if tr.style == LMI else b"text/event-stream")])
    gone: list[bool] = []
    watcher = asyncio.create_task(_watch_disconnect(receive, r, gone))
    try:
        await FrameRelay(r, send, tr.style == LMI, parts,
                         lambda frames: clock.relayed(r, frames)).run()
        clock.answered(r)
    except BackendError as exc:
        if not gone:
            clock.status = 500  # the model server failed: a 5XX, though the reply was 200
            _backend_failed(px.ctx, name, route, exc)
            await send({"type": "http.response.body", "more_body": True,
                        "body": eventstream.model_stream_error(
                            f"model server failed mid-stream: {exc}")})
        parts = None
    finally:
        watcher.cancel()
        r.close()
    if parts is not None and not gone:
        text = "".join(parts)
        if tr.style == LMI:
            final = json.dumps({"token": None, "generated_text": text}) + "\n"
            await send({"type": "http.response.body", "more_body": True,
                        "body": eventstream.payload_part(final.encode())})
        if captured:
            _capture(px, route, name, tr, text, account_id)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def counted_status(err: ServiceError) -> int:
    """The status Invocation4XXErrors / Invocation5XXErrors count, as SageMaker's: for a
    ModelError the model server's own (a 4xx it answered, or a body it would not take, is
    a 4XX; its 5xx, no answer or a timeout (500) a 5XX), not the 424 the caller gets; for
    anything else the status of the reply."""
    return err.original_status if isinstance(err, ModelError) else err.status


class RuntimeASGI:
    """`POST /endpoints/{name}/invocations[-response-stream]`, ahead of FastAPI's router;
    anything else goes on to the app."""

    def __init__(self, app: ASGIApp, px: Proxy, keyring: KeyRing,
                 metrics: ApiMetrics) -> None:
        self.app, self.px, self.keyring, self.metrics = app, px, keyring, metrics
        self.settings = px.ctx.settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts = scope["path"].split("/") if scope["type"] == "http" else []
        if (len(parts) != 4 or parts[1] != "endpoints"
                or parts[3] not in ("invocations", "invocations-response-stream")):
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":  # sagemaker-runtime only ever POSTs here
            body = json.dumps({"message": f"Method {scope['method']} not allowed: "
                                          f"{scope['path']} accepts POST only"}).encode()
            await _reply(send, 405, body, b"application/json", [(b"allow", b"POST")])
            return
        clock, code, account_id = Clock(), "OK", ""
        status = 500  # unless it ends well or as a ServiceError: an unexpected failure
        signed = SignedRequest.of(scope)
        headers = signed.headers
        try:
            raw, account_id = await self._authenticated_body(signed, receive)
            check_request(parts[2], headers, raw)
            if parts[3] == "invocations":
                await _invoke(self.px, send, headers, parts[2], raw, clock, account_id)
            else:
                await _stream(self.px, receive, send, headers, parts[2], raw, clock,
                              account_id)
            status = clock.status
        except ServiceError as err:
            code, status = err.code, counted_status(err)
            await _error_reply(send, err)
        finally:
            self.metrics.observe_invocation(code, clock.own, clock.frames, clock.forward)
            if clock.route is not None:
                self.metrics.invocation(invocation(clock, account_id, status))


    async def _authenticated_body(self, signed: SignedRequest,
                                  receive: Receive) -> tuple[bytes, str]:
        """The body of a validly signed request and the account its key acts for. The
        Authorization header is checked first and at most MAX_BODY bytes are read: an
        unsigned or oversized request is refused without reading its body."""
        keys = self.keyring.current()
        raw, verified = await read_signed(
            signed, body_chunks(receive), BodyLimit(MAX_BODY, body_too_large),
            {k: v.secret for k, v in keys.items()},
            self.settings.region, self.settings.signature_max_skew)
        return raw, keys[verified.access_key].account_id


def install(app: FastAPI, ctx: Context) -> None:
    px = Proxy(ctx, Routes(ctx, ctx.settings.route_cache_seconds),
               BackendClient(connect_timeout=5.0,
                             read_timeout=ctx.settings.invocation_timeout_seconds),
               CaptureWriter(make_store(ctx.settings), ctx.settings.data_dir / "capture-spool",
                             ctx.settings.capture_flush_seconds,
                             limits=disk_quota.Limits.of(ctx.settings)))
    app.state.runtime_client = px.client
    app.state.routes = px.routes
    app.state.capture = px.capture
    app.add_middleware(RuntimeASGI, px=px, keyring=KeyRing(ctx.settings),
                       metrics=app.state.metrics)  # protocol.install made it
