"""One request's generation: token ids from the engine -> text deltas, stop strings, usage.

The engine is not thread-safe, so requests run one at a time on a dedicated thread (the
`Runner`); a streaming request receives its deltas through an asyncio queue.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from workers.serving.embedded.metrics import ServerMetrics


class Engine(Protocol):
    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
        top_p: float = 1.0, stop_token_ids: tuple[int, ...] = (), seed: int | None = None,
    ) -> Iterator[list[int]]: ...


@dataclass
class Request:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


@dataclass
class Delta:
    text: str
    finish_reason: str | None = None
    completion_tokens: int = 0


def spec_counters(engine: Any) -> tuple[int, int, int, list[int]]:
    """The engine's cumulative spec-decode counters (zeros for a plain target engine)."""
    stats = getattr(engine, "stats", None)
    if stats is None:
        return 0, 0, 0, []
    return (int(getattr(stats, "num_drafts", 0)), int(getattr(stats, "num_draft_tokens", 0)),
            int(getattr(stats, "num_accepted_tokens", 0)),
            list(getattr(stats, "accepted_per_pos", []) or []))


class Runner:
    def __init__(self, engine: Engine, tokenizer: Any, metrics: ServerMetrics,
                 stop_token_ids: tuple[int, ...]) -> None:
        self.engine, self.tokenizer, self.metrics = engine, tokenizer, metrics
        self.stop_token_ids = stop_token_ids
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self.lock = threading.Lock()

    def _deltas(self, req: Request) -> Iterator[Delta]:
        ids: list[int] = []
        sent, text = "", ""
        finish = "length"
        hold = max((len(x) for x in req.stop if x), default=1) - 1
        for step in self.engine.generate(req.prompt_ids, req.max_tokens, req.temperature,
                                         req.top_p, self.stop_token_ids, req.seed):
            ids.extend(step)
            if ids and ids[-1] in self.stop_token_ids:
                ids.pop()
                finish = "stop"
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            hit = [text.index(s) for s in req.stop if s and s in text]
            if hit:
                text, finish = text[: min(hit)], "stop"
            done = finish == "stop" or len(ids) >= req.max_tokens
            # Hold back what may still change: an incomplete multi-byte character, and the
            # last len(stop)-1 characters, which may turn out to start a stop string.
            ready = len(text) if done else len(text) - hold
            if not done and text.endswith("\ufffd"):
                ready = min(ready, len(text.rstrip("\ufffd")))
            if ready > len(sent) and text[: len(sent)] == sent:
                yield Delta(text[len(sent):ready], completion_tokens=len(ids))
                sent = text[:ready]
            if done:
                break
        tail = text[len(sent):] if text.startswith(sent) else ""
        yield Delta(tail, finish, len(ids))

    def run_sync(self, req: Request, sink: Any) -> None:
        """Generate on the engine thread, handing each Delta to `sink` (a callable)."""
        with self.lock:
            before = spec_counters(self.engine)
            with self.metrics.lock:
                self.metrics.requests_running += 1
            completion = 0
            try:
                for delta in self._deltas(req):
                    completion = delta.completion_tokens
                    sink(delta)
            finally:
                after = spec_counters(self.engine)
                per_pos = [a - (before[3][i] if i < len(before[3]) else 0)
                           for i, a in enumerate(after[3])]
                self.metrics.add_spec(after[0] - before[0], after[1] - before[1],
                                      after[2] - before[2], per_pos)
                with self.metrics.lock:
                    self.metrics.requests_running -= 1
                    self.metrics.requests_ok += 1
                    self.metrics.prompt_tokens += len(req.prompt_ids)
                    self.metrics.generation_tokens += completion

    async def stream(self, req: Request) -> AsyncIterator[Delta]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Delta | BaseException | None] = asyncio.Queue()

        def work() -> None:
            try:
                self.run_sync(req, lambda d: loop.call_soon_threadsafe(queue.put_nowait, d))
            except BaseException as exc:  # surfaced to the HTTP layer
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        fut = loop.run_in_executor(self.pool, work)
        while (item := await queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
        await fut

    async def complete(self, req: Request) -> tuple[str, str, int]:
        parts, finish, tokens = [], "length", 0
        async for d in self.stream(req):
            parts.append(d.text)
            finish = d.finish_reason or finish
            tokens = d.completion_tokens
        return "".join(parts), finish, tokens
