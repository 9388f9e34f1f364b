"""What the metrics count of one sagemaker-runtime invocation (api/observability.py): the
proxy's own time, the model server's, the route it took."""

from __future__ import annotations

import time

from eaglenest.api.observability import Invocation
from eaglenest.api.runtime.routes import Route
from eaglenest.foundation.http.backend_client import BackendResponse


class Clock:
    """One invocation as the metrics see it. `own` is the proxy's own time (SageMaker's
    OverheadLatency): from the request's arrival to its sending to the model server
    (`forward`, also counted alone: the part every caller waits for before the model
    starts; up to the write that hands the request over, see `BackendClient._exchange`),
    plus, per frame, from the chunk's arrival to the frame's writing (the write included).
    Waiting on the model server is not counted. `model` (ModelLatency): the request's
    sending -> the last bytes of the model server's reply, once that reply was read to its
    end. `route`: set once the endpoint is found (only then is the invocation counted per
    endpoint); `status`: what a stream that failed midway counts as (its reply was 200)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.own = self.forward = 0.0
        self.frames = 0
        self.sending = False
        self.model: float | None = None
        self.route: Route | None = None
        self.status = 200

    def sent(self, r: BackendResponse) -> None:
        self.forward = r.sent_at - self.start
        self.own += self.forward
        self.sending = True

    def answered(self, r: BackendResponse) -> None:
        """The model server's reply was read to its end."""
        self.model = r.last_data_at - r.sent_at

    def overhead(self) -> float:
        """`own`; all the time it took when nothing was sent to a model server."""
        return self.own if self.sending else time.monotonic() - self.start

    def relayed(self, r: BackendResponse, frames: int = 1) -> None:
        self.own += time.monotonic() - r.last_data_at
        self.frames += frames


def invocation(clock: Clock, account_id: str, status: int) -> Invocation:
    route = clock.route
    assert route is not None
    return Invocation(account_id, route.endpoint, route.variant, len(route.urls), status,
                      clock.model, clock.overhead())
