"""Forking owned children: the one long-lived thread of a process that forks them
(`Spawner`), and the parent death signal a child sets before it runs (`die_with_parent`).
The kernel ties that signal to the thread that forked, so a child forked by a short-lived
thread would die with the thread; foundation/host/children.py starts every child through
both."""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

PR_SET_PDEATHSIG = 1
T = TypeVar("T")


class Spawner:
    """The one thread of this process that forks children (foundation/host/children.py's
    module docstring: the parent death signal is tied to the thread that forked)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None or self._pid != os.getpid():  # none yet, or forked
                self._jobs, self._pid = queue.SimpleQueue(), os.getpid()
                self._thread = threading.Thread(target=self._loop, args=(self._jobs,),
                                                name="eaglenest-spawner", daemon=True)
                self._thread.start()
            jobs = self._jobs
        future: Future[T] = Future()
        jobs.put((fn, future))
        return future.result()

    @staticmethod
    def _loop(jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]]) -> None:
        while True:
            fn, future = jobs.get()
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)


def _prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not Linux: process groups and reap() remain
        return None


_PRCTL = _prctl()


def die_with_parent(parent: int | None = None) -> None:
    """In a child: SIGKILL when the parent dies; exit at once if it already has (`parent`:
    the pid the parent had before the fork, when known)."""
    parent = os.getppid() if parent is None else parent
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
