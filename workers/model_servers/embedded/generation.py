"""Requests -> engine -> text deltas, stop strings, usage and metrics.

Two ways to drive the engine, chosen by what it offers:

* a batching engine (``submit`` / ``step`` / ``cancel`` / ``abort_all`` / ``has_work``, i.e.
  models.decode.batch.BatchEngine): the step loop; requests join between steps and every step
  decodes all of them in one target forward, so concurrent requests are not serialised;
* a batch-1 engine (``generate`` only): requests run one at a time.

Either way the engine runs on the thread that calls ``Runner.serve`` (the process's main
thread, the one that loaded the model: see __main__.py for why no other thread may run torch)
and the HTTP side hands requests over through a queue. Each request's token ids go through a
``Detokenizer`` (text deltas, stop strings, hold-back) and a streaming request receives its
deltas through an asyncio queue.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from eaglenest.workers.model_servers.embedded.metrics import ServerMetrics


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


Sink = Callable[[Delta | BaseException | None], None]  # None = end of the stream
_WAKE_SECONDS = 0.5  # an idle engine thread looks at the stop flag this often
_HANDOFF_SECONDS = 0.05  # the most a step waits for its first tokens to leave (_hand_off)


def spec_counters(engine: Any) -> tuple[int, int, int, list[int]]:
    """The engine's cumulative spec-decode counters (zeros for a plain target engine)."""
    stats = getattr(engine, "stats", None)
    if stats is None:
        return 0, 0, 0, []
    return (int(getattr(stats, "num_drafts", 0)), int(getattr(stats, "num_draft_tokens", 0)),
            int(getattr(stats, "num_accepted_tokens", 0)),
            list(getattr(stats, "accepted_per_pos", []) or []))


class Detokenizer:
    """One request's ids -> text deltas: stop tokens and strings, and hold-back."""

    def __init__(self, tokenizer: Any, req: Request, stop_token_ids: tuple[int, ...]) -> None:
        self.tokenizer, self.req, self.stop_token_ids = tokenizer, req, stop_token_ids
        self.ids: list[int] = []
        self.sent, self.text, self.finish = "", "", "length"
        self.hold = max((len(x) for x in req.stop if x), default=1) - 1
        self.done = False

    def feed(self, step: list[int]) -> list[Delta]:
        """The deltas that are final after this step's tokens (sets ``done``)."""
        ids, req = self.ids, self.req
        ids.extend(step)
        if ids and ids[-1] in self.stop_token_ids:
            ids.pop()
            self.finish = "stop"
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        hit = [text.index(s) for s in req.stop if s and s in text]
        if hit:
            text, self.finish = text[: min(hit)], "stop"
        self.text = text
        self.done = self.finish == "stop" or len(ids) >= req.max_tokens
        # Hold back what may still change: an incomplete multi-byte character, and the
        # last len(stop)-1 characters, which may turn out to start a stop string.
        ready = len(text) if self.done else len(text) - self.hold
        if not self.done and text.endswith("\ufffd"):
            ready = min(ready, len(text.rstrip("\ufffd")))
        if ready > len(self.sent) and text[: len(self.sent)] == self.sent:
            out = [Delta(text[len(self.sent):ready], completion_tokens=len(ids))]
            self.sent = text[:ready]
            return out
        return []

    def close(self) -> Delta:
        """The final delta: what is left of the text, the finish reason and the usage."""
        tail = self.text[len(self.sent):] if self.text.startswith(self.sent) else ""
        return Delta(tail, self.finish, len(self.ids))


@dataclass
class _Job:
    req: Request
    sink: Sink
    detok: Detokenizer
    rid: int = -1
    cancelled: bool = False  # set by the HTTP side when the client goes away
    finished: bool = False
    #: set by the HTTP side once its consumer has taken a delta (for a streamed response:
    #: once the chunk was handed to the socket); the engine waits on it for first tokens
    taken: threading.Event = field(default_factory=threading.Event)


class Runner:
    def __init__(self, engine: Engine, tokenizer: Any, metrics: ServerMetrics,
                 stop_token_ids: tuple[int, ...]) -> None:
        self.engine, self.tokenizer, self.metrics = engine, tokenizer, metrics
        self.stop_token_ids = stop_token_ids
        self.batched = all(callable(getattr(engine, name, None))
                           for name in ("submit", "step", "cancel", "abort_all"))
        # jobs from the HTTP side; None only wakes the engine thread (a cancel, a stop)
        self._inbox: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._spec_seen = spec_counters(engine)
        #: called on the engine thread before every step (the thread governor's tick)
        self.between_steps: Callable[[], object] | None = None

    def serve(self) -> None:
        """Run the engine on the calling thread until ``stop()``."""
        if self.batched:
            self._loop()
        else:
            self._loop_one_at_a_time()

    def stop(self) -> None:
        """Make ``serve`` return (between steps); requests still in flight are not answered."""
        self._stop.set()
        self._inbox.put(None)

    # ---- metrics ---------------------------------------------------------------------------
    def _started(self) -> None:
        with self.metrics.lock:
            self.metrics.requests_running += 1

    def _finished(self, req: Request, completion: int, ok: bool = True) -> None:
        with self.metrics.lock:
            self.metrics.requests_running -= 1
            self.metrics.requests_ok += int(ok)
            self.metrics.prompt_tokens += len(req.prompt_ids)
            self.metrics.generation_tokens += completion

    def _sync_spec(self) -> None:
        """Add the engine's spec-decode counters since the last call to the metrics."""
        before, after = self._spec_seen, spec_counters(self.engine)
        per_pos = [a - (before[3][i] if i < len(before[3]) else 0) for i, a in enumerate(after[3])]
        self.metrics.add_spec(after[0] - before[0], after[1] - before[1], after[2] - before[2],
                              per_pos)
        self._spec_seen = after
        rounds = getattr(self.engine, "rounds_by_k", None)
        if rounds:
            self.metrics.set_rounds(rounds, getattr(self.engine, "last_k", None))
        steps = getattr(self.engine, "steps_by_decoding", None)
        if steps:
            self.metrics.set_steps(steps)

    # ---- batch-1 engine: one request at a time ----------------------------------------------
    def _loop_one_at_a_time(self) -> None:
        while not self._stop.is_set():
            try:
                job = self._inbox.get(timeout=_WAKE_SECONDS)
            except queue.Empty:
                continue
            if job is None:
                continue
            try:
                if not job.cancelled:  # a client gone before its turn costs nothing
                    self._run_one(job)
            except Exception as exc:  # surfaced to the HTTP layer
                job.sink(exc)
            finally:
                job.finished = True
                job.sink(None)

    def _run_one(self, job: _Job) -> None:
        """Generate one request, handing each Delta to its sink; stops early if cancelled."""
        req, detok = job.req, job.detok
        self._started()
        try:
            for step in self.engine.generate(req.prompt_ids, req.max_tokens, req.temperature,
                                             req.top_p, self.stop_token_ids, req.seed):
                if self.between_steps is not None:
                    self.between_steps()
                for delta in detok.feed(step):
                    job.sink(delta)
                if detok.done or job.cancelled:
                    break
            job.sink(detok.close())
        finally:
            self._sync_spec()
            self._finished(req, len(detok.ids), ok=not job.cancelled)

    # ---- batching engine: the step loop --------------------------------------------------------
    def _loop(self) -> None:
        engine: Any = self.engine
        jobs: dict[int, _Job] = {}
        while not self._stop.is_set():
            self._take(jobs, block=not engine.has_work)
            for job in [j for j in jobs.values() if j.cancelled]:
                engine.cancel(job.rid)
                self._end(jobs, job, None, ok=False)
            if not engine.has_work:
                continue
            cancels: list[int] = []
            if self.between_steps is not None:
                self.between_steps()
            try:  # first tokens go out as soon as their prefill is done (on_admitted)
                events = engine.step(partial(self._hand_off, jobs, cancels))
            except Exception as exc:  # fail every request in flight, keep serving
                engine.abort_all()
                for job in list(jobs.values()):
                    self._end(jobs, job, exc, ok=False)
                continue
            self._deliver(jobs, events, cancels)
            for rid in cancels:
                engine.cancel(rid)
            self._sync_spec()

    def _deliver(self, jobs: dict[int, _Job], events: list[tuple[int, list[int], bool]],
                 cancels: list[int]) -> None:
        """Send each event's text; end the requests that finished. One stopped by a stop
        string before the engine finished it goes into ``cancels`` (cancel after the step)."""
        for rid, new, done in events:
            found = jobs.get(rid)
            if found is None:
                continue  # already ended earlier in this step (a stop string)
            job = found
            for delta in job.detok.feed(new):
                job.sink(delta)
            if job.detok.done or done:
                if not done:
                    cancels.append(rid)
                self._end(jobs, job, job.detok.close())

    def _hand_off(self, jobs: dict[int, _Job], cancels: list[int],
                  events: list[tuple[int, list[int], bool]]) -> None:
        """Deliver the admitted requests' first tokens, then wait (at most _HANDOFF_SECONDS)
        until the HTTP thread has taken each one. The step's batched forward comes next and
        holds the CPU and, between its ops, the GIL: on a busy host the HTTP thread could
        otherwise send the first token only after that whole step."""
        waiting = [jobs[rid] for rid, _, _ in events if rid in jobs]
        for job in waiting:
            job.taken.clear()
        self._deliver(jobs, events, cancels)
        deadline = time.monotonic() + _HANDOFF_SECONDS
        for job in waiting:
            if job.detok.sent and not job.finished and not job.cancelled:
                job.taken.wait(max(0.0, deadline - time.monotonic()))

    def _take(self, jobs: dict[int, _Job], block: bool) -> None:
        """Submit the jobs waiting in the inbox (waiting for one if ``block``)."""
        try:
            job = self._inbox.get(timeout=_WAKE_SECONDS) if block else self._inbox.get_nowait()
            while True:
                if job is not None:
                    self._started()
                    try:
                        r = job.req
                        job.rid = self.engine.submit(  # type: ignore[attr-defined]
                            r.prompt_ids, r.max_tokens, r.temperature, r.top_p,
                            self.stop_token_ids, r.seed)
                        jobs[job.rid] = job
                    except Exception as exc:
                        self._end(jobs, job, exc, ok=False)
                job = self._inbox.get_nowait()
        except queue.Empty:
            return

    def _end(self, jobs: dict[int, _Job], job: _Job, last: Delta | BaseException | None,
             ok: bool = True) -> None:
        jobs.pop(job.rid, None)
        job.finished = True
        if last is not None:
            job.sink(last)
        job.sink(None)
        self._finished(job.req, len(job.detok.ids), ok)

    # ---- HTTP side ---------------------------------------------------------------------------
    async def stream(self, req: Request) -> AsyncIterator[Delta]:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[Delta | BaseException | None] = asyncio.Queue()

        def put(item: Delta | BaseException | None) -> None:
            loop.call_soon_threadsafe(inbox.put_nowait, item)

        job = _Job(req, put, Detokenizer(self.tokenizer, req, self.stop_token_ids))
        self._inbox.put(job)
        try:
            while (item := await inbox.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
                job.taken.set()  # the consumer came back for more: it has dealt with item
        finally:
            if not job.finished:  # the client went away: free the batch slot
                job.cancelled = True
                self._inbox.put(None)

    async def complete(self, req: Request) -> tuple[str, str, int]:
        parts, finish, tokens = [], "length", 0
        async for d in self.stream(req):
            parts.append(d.text)
            finish = d.finish_reason or finish
            tokens = d.completion_tokens
        return "".join(parts), finish, tokens
