"""Background loops that survive: run a body every `interval` seconds on a daemon thread until
an Event is set, whatever the body raises.

Contract (`Loop`):
- the body runs first after one `interval` (``first=True``: at once), then every
  `interval` seconds, until `stop` is set (`Loop.stop()` sets it and joins the thread);
- any exception out of the body (``BaseException``: a thread that dies takes its work with
  it, e.g. the Data Capture flush after `OSError: [Errno 24] Too many open files`) is logged
  with its traceback, counted in `failures`, and the body runs again after a back-off:
  after k failures in a row the wait is ``min(interval * 2**k, max(interval, max_backoff))``;
  a success returns to `interval`. A heartbeat passes ``max_backoff=interval`` (a later
  beat would lose its lease);
- nothing else is caught: the wait itself, and logging, cannot fail short of the process.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("eaglenest.loops")

#: the longest wait after repeated failures, unless a loop sets its own
MAX_BACKOFF_SECONDS = 60.0


class Loop:
    def __init__(self, name: str, body: Callable[[], object], interval: float, *,
                 stop: threading.Event | None = None, first: bool = False,
                 max_backoff: float = MAX_BACKOFF_SECONDS,
                 logger: logging.Logger | None = None) -> None:
        self.name, self.body, self.interval = name, body, interval
        self.stop_event = stop if stop is not None else threading.Event()
        self.first, self.max_backoff = first, max_backoff
        self.log = logger or log
        self.failures = 0  # in a row; 0 after a success
        self.runs = 0  # bodies that returned
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)

    def start(self) -> Loop:
        self.thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Ask the loop to end and wait up to `timeout` for the body in progress."""
        self.stop_event.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def next_wait(self) -> float:
        if not self.failures:
            return self.interval
        return min(self.interval * 2 ** self.failures, max(self.interval, self.max_backoff))

    def run(self) -> None:
        """The thread's target: run, wait, run... until `stop_event` is set."""
        if self.first and not self.stop_event.is_set():
            self.once()
        while not self.stop_event.wait(self.next_wait()):
            self.once()

    def once(self) -> None:
        """One run of the body; what it raises is logged and counted, never propagated."""
        try:
            self.body()
        except BaseException as exc:  # the contract: the loop goes on
            self.failures += 1
            self.log.error("%s failed (%d in a row; next try in %.1f s): %s", self.name,
                           self.failures, self.next_wait(), exc, exc_info=exc)
        else:
            self.failures = 0
            self.runs += 1

