"""The one transfer rule of both directions (foundation/http/pace.py): a gap with no byte moved,
and a minimum average rate after the first gap, counted only while the client holds the
transfer up. tests/security/test_connections.py checks it against a real server."""

from __future__ import annotations

import asyncio

from eaglenest.foundation.http.pace import SLOW, STALLED, Clock, Pace


def test_a_silent_client_is_stalled_at_the_gap() -> None:
    pace = Pace(gap=20, min_rate=500)
    assert pace.step(19.5, 0, held=True) is None
    assert pace.due() == 0.5
    assert pace.step(0.5, 0, held=True) == STALLED


def test_a_byte_every_8_seconds_is_too_slow_after_the_gap() -> None:
    """Every gap is under 20 s, but 1 byte per 8 s is under 500 bytes/s: cut at about
    20 s (20 + 3/500), not after the whole body."""
    pace = Pace(gap=20, min_rate=500)
    verdicts = [pace.step(8, 1, held=True) for _ in range(3)]
    assert verdicts == [None, None, SLOW]


def test_bytes_moved_buy_time() -> None:
    """500 bytes/s after the first 20 s: 10,000 bytes buy 20 s more, at any pace."""
    pace = Pace(gap=20, min_rate=500)
    assert pace.step(19, 10_000, held=True) is None
    assert pace.due() == 20  # the gap restarted (the rate allows 40 - 19 = 21 s)
    for _ in range(2):
        assert pace.step(10, 1, held=True) is None
    assert pace.step(10, 1, held=True) == SLOW  # 49 s held for 10,003 bytes


def test_time_the_client_does_not_hold_up_is_free() -> None:
    pace = Pace(gap=20, min_rate=500)
    assert pace.step(3600, 0, held=False) is None
    assert pace.step(19, 0, held=True) is None
    assert pace.waited == 19
    pace = Pace(gap=20, min_rate=0)
    assert pace.step(19, 0, held=True) is None
    assert pace.step(60, 0, held=False) is None  # and restarts the gap
    assert pace.step(19, 0, held=True) is None
    assert pace.waited == 38 and pace.quiet == 19


def test_no_rate_rule_at_zero() -> None:
    pace = Pace(gap=20, min_rate=0)
    assert [pace.step(19, 1, held=True) for _ in range(100)] == [None] * 100


def test_the_clock_samples_and_stops() -> None:
    """Held and silent: STALLED at the gap. Not held at a sample: the clock stops (a
    response the client took), unless it keeps running (a body)."""
    async def run(held: bool, keep: bool) -> tuple[list[str], float, bool]:
        loop = asyncio.get_running_loop()
        kinds: list[str] = []
        clock = Clock(loop, Pace(gap=0.2, min_rate=0), lambda: (0, held), kinds.append,
                      keep=keep)
        t0 = loop.time()
        clock.start()
        await asyncio.sleep(0.5)
        running = clock.running
        clock.stop()
        return kinds, loop.time() - t0, running

    kinds, _, running = asyncio.run(run(held=True, keep=False))
    assert kinds == [STALLED] and not running
    kinds, _, running = asyncio.run(run(held=False, keep=False))
    assert kinds == [] and not running
    kinds, _, running = asyncio.run(run(held=False, keep=True))
    assert kinds == [] and running
