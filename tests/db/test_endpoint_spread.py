"""An endpoint over several hosts, in the database (db/endpoint_spread.py): what a transition
started so far is recorded only by its owner and dropped when it ends; what each host is to
stop is kept across transitions, removed host by host, and holds the row back from deletion;
free room per host counts whole instances of live workers only (db/placement_repo.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglenest.db import endpoint_spread as spread
from eaglenest.db import endpoints_repo as eps
from eaglenest.db import placement_repo
from eaglenest.db.migrate import upgrade_head
from eaglenest.db.session import Database
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation.host.children import Identity
from eaglenest.foundation.host.gpus import Gpu
from tests.support.endpoint_rows import ACCOUNT, EP, seed_endpoint

A0 = {"unit": "v-a-0", "host": "host-a", "url": "http://a:1"}
B0 = {"unit": "v-b-0", "host": "host-b", "url": "http://b:1"}
B1 = {"unit": "v-b-1", "host": "host-b", "url": "http://b:2"}


@pytest.fixture(autouse=True)
def _seeded(db: Database) -> None:
    with db.session() as s:
        seed_endpoint(s)


def deployment(db: Database) -> dict:
    with db.session() as s:
        row = s.query(EndpointRow).filter_by(name="ep").one_or_none()
        return dict(row.deployment) if row is not None else {}


def test_only_the_owner_records_what_it_placed_and_the_end_drops_it(db: Database) -> None:
    placed = {"v": {"instances": [A0]}}
    with db.session() as s:
        assert not spread.save_placing(s, EP, "me:1", eps.CREATING, placed)  # not claimed
        assert eps.claim(s, EP, eps.CREATING, "me:1", 60)
    with db.session() as s:
        assert not spread.save_placing(s, EP, "me:1", eps.UPDATING, placed)
        assert spread.save_placing(s, EP, "me:1", eps.CREATING, placed)
    assert spread.placing(deployment(db)) == placed
    with db.session() as s:
        assert eps.mark_in_service(s, EP, {"Servers": {"v": {"instances": [A0, B0]}}})
    assert deployment(db) == {"Servers": {"v": {"instances": [A0, B0]}}}


def test_each_host_stops_its_own_and_the_row_waits_for_them(db: Database) -> None:
    with db.session() as s:
        eps.mark_in_service(s, EP, {"Servers": {"v": {"instances": [A0, B0, B1]}}})
        assert spread.retire(s, EP, {"host-b": [B0]})
        assert spread.retire(s, EP, {"host-b": [B1]})
        # a transition that writes a new deployment keeps what hosts still have to stop
        eps.request_update(s, ACCOUNT, "ep", "c2", {"EndpointConfigName": "c2"})
        assert eps.finish_update(s, EP, {"Servers": {"v": {"instances": [A0]}}})
    with db.session() as s:
        assert spread.retiring_hosts(s, EP) == ["host-b"]
        assert spread.retiring(s, EP, "host-b") == [B0, B1]
        assert spread.retiring(s, EP, "host-a") == []
        assert eps.request_delete(s, ACCOUNT, "ep") == EP
    with db.session() as s:
        assert not eps.finish_delete(s, EP)  # host-b has not stopped its instances yet
        assert spread.retired(s, EP, "host-b", ["v-b-0"]) == (eps.DELETING, 1)
        assert spread.retired(s, EP, "host-b", ["v-b-1"]) == (eps.DELETING, 0)
    assert spread.settled(deployment(db))
    with db.session() as s:
        assert eps.finish_delete(s, EP)
    assert deployment(db) == {}
    with db.session() as s:
        assert spread.retired(s, EP, "host-b", ["v-b-0"]) == ("", 0)
        assert spread.retiring(s, EP, "host-b") == []


def test_a_host_without_a_live_worker_is_forgotten(db: Database) -> None:
    with db.session() as s:
        eps.mark_in_service(s, EP, {"Servers": {}})
        spread.retire(s, EP, {"host-a": [A0], "host-b": [B0]})
    with db.session() as s:
        assert spread.forget_hosts(s, EP, {"host-a"}) == [B0]
    assert deployment(db)[spread.RETIRING] == {"host-a": [A0]}


def test_a_rollback_hands_the_placed_instances_to_their_hosts(db: Database) -> None:
    with db.session() as s:
        eps.mark_in_service(s, EP, {"Servers": {"v": {"instances": [A0]}}})
        eps.request_update(s, ACCOUNT, "ep", "c2", {"EndpointConfigName": "c2"})
        assert eps.claim(s, EP, eps.UPDATING, "me:1", 60)
    with db.session() as s:
        assert spread.save_placing(s, EP, "me:1", eps.UPDATING, {"v": {"instances": [B0, B1]}})
        eps.rollback_update(s, EP, "why")
    dep = deployment(db)
    assert spread.PLACING not in dep and dep[spread.RETIRING] == {"host-b": [B0, B1]}
    assert dep["Servers"] == {"v": {"instances": [A0]}}


def test_free_slots_count_whole_instances_on_live_serving_hosts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'slots.db'}"
    upgrade_head(url)
    d = Database(url)
    ident = Identity.of(1) or Identity(1, 0)
    gpus = tuple(Gpu(i, "A10G", 24.0) for i in range(4))
    try:
        with d.session() as s:
            for owner, host, n, queues in (("vm:1", "host-a", 2, "train,serve"),
                                           ("vm:2", "host-b", 4, "train,serve"),
                                           ("vm:3", "host-c", 4, "train")):
                info = placement_repo.WorkerInfo(owner, host, ident, queues, gpus[:n])
                placement_repo.register(s, info)
            b = placement_repo.WorkerInfo("vm:2", "host-b", ident, "train,serve", gpus)
            assert placement_repo.take(s, b, "arn:x", "u", 1, 24.0) == [0]
        with d.session() as s:
            assert placement_repo.free_slots(s, "serve", 1, 24.0, 60) == {
                "host-a": 2, "host-b": 3}
            assert placement_repo.free_slots(s, "serve", 2, 24.0, 60) == {
                "host-a": 1, "host-b": 1}
            assert placement_repo.free_slots(s, "serve", 1, 80.0, 60) == {
                "host-a": 0, "host-b": 0}
            assert placement_repo.live_hosts(s, "serve", 60) == {"host-a", "host-b"}
            assert placement_repo.release(s, "arn:x", hosts=["host-a"]) == 0
            assert placement_repo.release(s, "arn:x", hosts=["host-b"]) == 1
    finally:
        d.dispose()
