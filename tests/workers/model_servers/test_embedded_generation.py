"""workers/model_servers/embedded/generation.py Runner: an admitted request's first token is taken
by the HTTP side before the step that admitted it goes on to its batched forward."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from eaglenest.workers.model_servers.embedded import generation
from eaglenest.workers.model_servers.embedded.generation import Request, Runner
from eaglenest.workers.model_servers.embedded.metrics import ServerMetrics


class _Tokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"<{i}>" for i in ids)


class _Engine:
    """A batching engine whose step admits, reports first tokens through ``on_admitted``,
    then records what the HTTP side had taken when its 'batched forward' began."""

    def __init__(self, taken: Callable[[], int]) -> None:
        self.taken, self.waiting, self.active = taken, list[int](), dict[int, int]()
        self.seen_at_forward: list[int] = []
        self.forward_at: list[float] = []
        self.stats = None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.active)

    def submit(self, prompt: list[int], max_new: int, *args: Any) -> int:
        rid = len(self.seen_at_forward) + len(self.waiting) + len(self.active) + 1
        self.waiting.append(rid)
        return rid

    def step(self, on_admitted: Callable[[list[tuple[int, list[int], bool]]], None]
             ) -> list[tuple[int, list[int], bool]]:
        first = [(rid, [rid * 10], False) for rid in self.waiting]
        self.active.update({rid: 1 for rid in self.waiting})
        self.waiting = []
        if first:
            on_admitted(first)
        self.seen_at_forward.append(self.taken())
        self.forward_at.append(time.monotonic())
        time.sleep(0.3)  # the batched forward
        events = []
        for rid in list(self.active):
            self.active.pop(rid)
            events.append((rid, [rid * 10 + 1], True))
        return events

    def cancel(self, rid: int) -> None:
        self.active.pop(rid, None)

    def abort_all(self) -> None:
        self.active.clear()


def _serve(engine: _Engine) -> tuple[Runner, threading.Thread]:
    runner = Runner(engine, _Tokenizer(), ServerMetrics("m"), stop_token_ids=())  # type: ignore[arg-type]
    thread = threading.Thread(target=runner.serve, daemon=True)
    thread.start()
    return runner, thread


def test_first_token_is_taken_before_the_step_goes_on(monkeypatch):
    monkeypatch.setattr(generation, "_HANDOFF_SECONDS", 10.0)  # a slow CI host still waits
    got: list[tuple[float, str]] = []
    engine = _Engine(taken=lambda: len(got))
    runner, thread = _serve(engine)

    async def consume() -> None:
        async for delta in runner.stream(Request([1, 2, 3], max_tokens=2)):
            got.append((time.monotonic(), delta.text))

    try:
        t0 = time.monotonic()
        asyncio.run(consume())
    finally:
        runner.stop()
        thread.join(5)
    assert got[0][1] == "<10>" and "".join(text for _, text in got) == "<10><11>"
    assert engine.seen_at_forward == [1]  # the first token was out when the forward began
    assert got[0][0] - t0 < 0.25  # ... so it did not wait for the 0.3 s forward


def test_a_consumer_that_never_comes_back_delays_the_step_by_the_bound_only():
    engine = _Engine(taken=lambda: 0)
    runner, thread = _serve(engine)
    received: list[float] = []

    async def stall() -> None:
        stream = runner.stream(Request([1], max_tokens=2))
        await stream.__anext__()  # takes the first delta, then does not ask for more
        received.append(time.monotonic())
        await asyncio.sleep(0.5)
        await stream.aclose()

    try:
        asyncio.run(stall())
    finally:
        runner.stop()
        thread.join(5)
    # the engine gave up waiting after _HANDOFF_SECONDS (0.05) and ran its forward
    assert len(engine.forward_at) == 1 and len(received) == 1
    assert engine.forward_at[0] - received[0] < generation._HANDOFF_SECONDS + 0.2
