"""The endpoint transition lease and its watchdog queries, on a real SQLite database
migrated with Alembic: one worker claims a transition, a silent owner or a lost message
makes it unattended, a transition past the bound ends with a reason."""

from __future__ import annotations

import pytest

from eaglenest.db import endpoints_repo
from eaglenest.db.common import now
from eaglenest.db.migrate import upgrade_head
from eaglenest.db.session import Database
from eaglenest.db.tables import EndpointRow
from tests.support.endpoint_rows import ACCOUNT, seed_endpoint


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    upgrade_head(url)
    d = Database(url)
    with d.session() as s:
        seed_endpoint(s)
    yield d
    d.dispose()


def row(db: Database) -> EndpointRow:
    with db.session() as s:
        r = s.query(EndpointRow).filter_by(name="ep").one()
        s.expunge(r)
        return r


def age(db: Database, seconds: float, heartbeat: bool = False) -> None:
    """Move the transition's start (or the owner's last heartbeat) into the past."""
    with db.session() as s:
        r = s.query(EndpointRow).filter_by(name="ep").one()
        if heartbeat:
            r.heartbeat_time = now() - seconds
        else:
            r.last_modified_time = now() - seconds


def test_one_worker_claims_a_transition_until_its_lease_lapses(db):
    with db.session() as s:
        assert not endpoints_repo.claim(s, "ep", endpoints_repo.UPDATING, "w1", 60)
        assert endpoints_repo.claim(s, "ep", endpoints_repo.CREATING, "w1", 60)
    with db.session() as s:
        assert not endpoints_repo.claim(s, "ep", endpoints_repo.CREATING, "w2", 60)
        assert endpoints_repo.claim(s, "ep", endpoints_repo.CREATING, "w1", 60)  # again: ok
        assert endpoints_repo.heartbeat(s, "ep", "w2") is None
        assert endpoints_repo.heartbeat(s, "ep", "w1") == endpoints_repo.CREATING
    age(db, 61, heartbeat=True)
    with db.session() as s:
        assert endpoints_repo.unattended(s, 60) == [("ep", endpoints_repo.CREATING)]
        assert endpoints_repo.claim(s, "ep", endpoints_repo.CREATING, "w2", 60)  # w1 is dead
    with db.session() as s:
        assert endpoints_repo.mark_in_service(s, "ep", {"Servers": {}})
    r = row(db)
    assert (r.status, r.owner, r.heartbeat_time) == (endpoints_repo.IN_SERVICE, None, None)


def test_an_unowned_transition_is_unattended_after_a_lease(db):
    with db.session() as s:
        assert endpoints_repo.unattended(s, 60) == []  # its message may still be on the way
    age(db, 61)
    with db.session() as s:
        assert endpoints_repo.unattended(s, 60) == [("ep", endpoints_repo.CREATING)]


def test_transitions_past_the_bound_end_with_a_reason(db):
    with db.session() as s:
        assert endpoints_repo.time_out(s, 100) == []
    age(db, 101)
    with db.session() as s:
        assert endpoints_repo.time_out(s, 100) == ["ep"]
    r = row(db)
    assert r.status == endpoints_repo.FAILED
    assert r.failure_reason == ("The endpoint stayed Creating longer than 100 s "
                                "(EAGLENEST_ENDPOINT_TRANSITION_SECONDS); it was marked Failed.")
    with db.session() as s:  # a worker that finishes late changes nothing
        assert not endpoints_repo.mark_in_service(s, "ep", {"Servers": {"late": {}}})
    assert row(db).status == endpoints_repo.FAILED


def test_an_update_past_the_bound_rolls_back(db):
    with db.session() as s:
        endpoints_repo.mark_in_service(s, "ep", {"Servers": {"v": {"url": "u"}}})
    with db.session() as s:
        endpoints_repo.request_update(s, ACCOUNT, "ep", "c2", {"EndpointConfigName": "c2"})
    age(db, 101)
    with db.session() as s:
        assert endpoints_repo.time_out(s, 100) == ["ep"]
    r = row(db)
    assert (r.status, r.config_name, r.pending_config_name) == (
        endpoints_repo.IN_SERVICE, "c1", None)
    assert r.deployment == {"Servers": {"v": {"url": "u"}}}
    assert r.failure_reason == ("Update to c2 failed and was rolled back: The endpoint stayed "
                                "Updating longer than 100 s "
                                "(EAGLENEST_ENDPOINT_TRANSITION_SECONDS).")
