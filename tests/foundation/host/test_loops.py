"""foundation/host/loops.py: a background loop survives whatever its body raises, logs it, backs
off, and runs on at its own pace once the body succeeds again."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from eaglenest.foundation.host.loops import Loop


def wait(pred, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.mark.parametrize("error", [OSError(24, "Too many open files"), RuntimeError("x"),
                                   SystemExit(3)])
def test_the_loop_survives_what_its_body_raises(error: BaseException,
                                                caplog: pytest.LogCaptureFixture) -> None:
    calls: list[float] = []

    def body() -> None:
        calls.append(time.monotonic())
        if len(calls) == 2:
            raise error

    caplog.set_level(logging.ERROR, "eaglenest.loops")
    loop = Loop("test-loop", body, 0.02, first=True).start()
    try:
        wait(lambda: len(calls) >= 5)
        assert loop.thread.is_alive()
        assert loop.failures == 0 and loop.runs >= 4
    finally:
        loop.stop(timeout=5)
    assert not loop.thread.is_alive()
    (record,) = [r for r in caplog.records if "test-loop failed" in r.getMessage()]
    assert "1 in a row" in record.getMessage() and record.exc_info is not None
    assert calls[2] - calls[1] >= 0.04 - 0.005  # backed off: twice the interval


def test_back_off_doubles_up_to_its_cap_and_a_heartbeat_keeps_its_pace() -> None:
    loop = Loop("x", lambda: None, 1.0, max_backoff=5.0)
    waits = []
    for failures in range(5):
        loop.failures = failures
        waits.append(loop.next_wait())
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    beat = Loop("beat", lambda: None, 2.0, max_backoff=2.0)
    beat.failures = 7
    assert beat.next_wait() == 2.0


def test_stop_ends_the_loop_and_first_runs_at_once() -> None:
    stop = threading.Event()
    ran = threading.Event()
    loop = Loop("y", ran.set, 3600, stop=stop, first=True).start()
    assert ran.wait(5)
    stop.set()
    loop.thread.join(5)
    assert not loop.thread.is_alive()
