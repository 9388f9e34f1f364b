"""The runtime's route cache: snapshots of endpoints in use are re-read in the background,
so requests do not wait for the database; idle and gone endpoints are forgotten.

The database read (`_load`) is replaced by a slow stand-in that counts its calls: these
tests are about when it runs, not about the query (the endpoint tests cover that).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import eaglenest.api.runtime.routes as rr
from eaglenest.api.runtime.bodies import RuntimeValidationError

ACCOUNT = "000000000000"


class FakeDb:
    """`_load`'s stand-in: `delay` seconds per read; `gone` makes reads fail as for a
    deleted endpoint; `url` is what the next read returns."""

    def __init__(self, delay: float = 0.05) -> None:
        self.delay, self.calls, self.gone = delay, 0, False
        self.url = "http://127.0.0.1:1"
        self.urls: dict[str, str] = {}  # account -> its endpoint's url, where set

    def load(self, ctx: Any, name: str, ttl: float, account_id: str) -> rr._Snapshot:
        self.calls += 1
        time.sleep(self.delay)
        if self.gone:
            raise RuntimeValidationError(f"Endpoint {name} of account 0 not found.")
        url = self.urls.get(account_id, self.url)
        return rr._Snapshot({"AllTraffic": {"instances": [{"url": url}]}}, "InService",
                            None, time.monotonic() + ttl,
                            f"arn:aws:sagemaker:us-east-1:{account_id}:endpoint/{name}")


@pytest.fixture
def db(monkeypatch: pytest.MonkeyPatch) -> FakeDb:
    fake = FakeDb()
    monkeypatch.setattr(rr, "_load", fake.load)
    return fake


def test_requests_do_not_wait_for_the_database_while_the_endpoint_is_in_use(db: FakeDb) -> None:
    async def main() -> None:
        routes = rr.Routes(None, ttl=0.2)  # type: ignore[arg-type]
        first = await routes.resolve("ep", None, account_id=ACCOUNT)
        assert db.calls == 1 and not first.cached
        waits = []
        db.url = "http://127.0.0.1:2"  # the endpoint was updated: the refresh brings it
        for _ in range(8):  # 1.2 s: six TTLs, a request every 0.15 s (> 0.2 s apart: no)
            await asyncio.sleep(0.15)
            t0 = time.monotonic()
            route = await routes.resolve("ep", None, account_id=ACCOUNT)
            waits.append(time.monotonic() - t0)
            assert route.cached
        assert max(waits) < db.delay / 2  # none of them read the 50 ms database
        assert db.calls >= 4  # the background read it
        assert route.urls == ["http://127.0.0.1:2"]
        await routes.close()

    asyncio.run(main())


def test_a_cache_filled_by_requests_alone_would_miss_at_this_rate(db: FakeDb) -> None:
    """The control: ttl=0 (no cache, no refresher) reads the database on every request."""

    async def main() -> None:
        routes = rr.Routes(None, ttl=0)  # type: ignore[arg-type]
        for _ in range(3):
            route = await routes.resolve("ep", None, account_id=ACCOUNT)
            assert not route.cached
        assert db.calls == 3 and routes._refresher is None

    asyncio.run(main())


def test_idle_endpoints_are_forgotten_and_the_refresher_stops(db: FakeDb) -> None:
    async def main() -> None:
        routes = rr.Routes(None, ttl=0.1, idle_after=0.3)  # type: ignore[arg-type]
        await routes.resolve("ep", None, account_id=ACCOUNT)
        await asyncio.sleep(0.7)
        assert routes._refresher is None and not routes._snapshots
        calls = db.calls
        await asyncio.sleep(0.2)
        assert db.calls == calls  # nothing reads the database for an idle endpoint
        route = await routes.resolve("ep", None, account_id=ACCOUNT)  # the next request reads it itself
        assert not route.cached and db.calls == calls + 1
        await routes.close()

    asyncio.run(main())


def test_a_deleted_endpoint_is_dropped_by_the_refresh(db: FakeDb) -> None:
    async def main() -> None:
        routes = rr.Routes(None, ttl=0.1)  # type: ignore[arg-type]
        await routes.resolve("ep", None, account_id=ACCOUNT)
        db.gone = True
        await asyncio.sleep(0.4)
        assert (ACCOUNT, "ep") not in routes._snapshots
        with pytest.raises(RuntimeValidationError, match="not found"):
            await routes.resolve("ep", None, account_id=ACCOUNT)
        await routes.close()

    asyncio.run(main())


def test_the_refresh_reads_an_endpoint_in_use_about_once_per_three_quarters_ttl(
        db: FakeDb) -> None:
    """One read every 3/4 ttl (it was every ttl/2): about 2 s / 0.15 s = 13 reads while in
    use for 2 s at ttl 0.2 with a 10 ms database; a slow machine makes fewer, never more."""
    db.delay = 0.01

    async def main() -> None:
        routes = rr.Routes(None, ttl=0.2)  # type: ignore[arg-type]
        await routes.resolve("ep", None, account_id=ACCOUNT)
        calls0 = db.calls
        for _ in range(20):  # in use for 2 s: a request every 0.1 s
            await asyncio.sleep(0.1)
            assert (await routes.resolve("ep", None, account_id=ACCOUNT)).cached
        reads = db.calls - calls0
        assert 6 <= reads <= 16, reads  # every ttl/2 would be 20
        await routes.close()

    asyncio.run(main())


def test_two_accounts_endpoints_of_one_name_are_cached_apart(db: FakeDb) -> None:
    """Each account's endpoint `ep` routes to its own instances, cached or not, and a
    recovery would be asked for by its own ARN."""
    other = "222222222222"
    db.urls = {ACCOUNT: "http://127.0.0.1:1", other: "http://127.0.0.1:2"}

    async def main() -> None:
        routes = rr.Routes(None, ttl=5)  # type: ignore[arg-type]
        for cached in (False, True):
            mine = await routes.resolve("ep", None, account_id=ACCOUNT)
            theirs = await routes.resolve("EP", None, account_id=other)
            assert (mine.cached, theirs.cached) == (cached, cached)
            assert (mine.urls, theirs.urls) == (["http://127.0.0.1:1"], ["http://127.0.0.1:2"])
            assert (mine.arn.split(":")[4], theirs.arn.split(":")[4]) == (ACCOUNT, other)
        assert db.calls == 2
        await routes.close()

    asyncio.run(main())
