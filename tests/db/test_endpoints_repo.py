"""The endpoint transition lease and its watchdog queries, on a real SQLite database
migrated with Alembic: one worker claims a transition, a silent owner or a lost message
makes it unattended, a transition past the bound ends with a reason; workers act by ARN,
and two accounts' endpoints of one name are two endpoints."""

from __future__ import annotations

import pytest

from eaglenest.db import endpoints_repo
from eaglenest.db.repository import locate, now
from eaglenest.db.session import Database
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation.errors import ValidationException
from tests.support.endpoint_rows import ACCOUNT, EP, OTHER, OTHER_EP, seed_endpoint


@pytest.fixture(autouse=True)
def _seeded(db: Database) -> None:
    with db.session() as s:
        seed_endpoint(s)


def row(db: Database, account: str = ACCOUNT.account_id) -> EndpointRow:
    with db.session() as s:
        r = s.query(EndpointRow).filter_by(name="ep", account_id=account).one()
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
        assert not endpoints_repo.claim(s, EP, endpoints_repo.UPDATING, "w1", 60)
        assert endpoints_repo.claim(s, EP, endpoints_repo.CREATING, "w1", 60)
    with db.session() as s:
        assert not endpoints_repo.claim(s, EP, endpoints_repo.CREATING, "w2", 60)
        assert endpoints_repo.claim(s, EP, endpoints_repo.CREATING, "w1", 60)  # again: ok
        assert endpoints_repo.heartbeat(s, EP, "w2") is None
        assert endpoints_repo.heartbeat(s, EP, "w1") == endpoints_repo.CREATING
    age(db, 61, heartbeat=True)
    with db.session() as s:
        assert endpoints_repo.unattended(s, 60) == [(EP, endpoints_repo.CREATING)]
        assert endpoints_repo.claim(s, EP, endpoints_repo.CREATING, "w2", 60)  # w1 is dead
    with db.session() as s:
        assert endpoints_repo.mark_in_service(s, EP, {"Servers": {}})
    r = row(db)
    assert (r.status, r.owner, r.heartbeat_time) == (endpoints_repo.IN_SERVICE, None, None)


def test_an_unowned_transition_is_unattended_after_a_lease(db):
    with db.session() as s:
        assert endpoints_repo.unattended(s, 60) == []  # its message may still be on the way
    age(db, 61)
    with db.session() as s:
        assert endpoints_repo.unattended(s, 60) == [(EP, endpoints_repo.CREATING)]


def test_transitions_past_the_bound_end_with_a_reason(db):
    with db.session() as s:
        assert endpoints_repo.time_out(s, 100) == []
    age(db, 101)
    with db.session() as s:
        assert endpoints_repo.time_out(s, 100) == [EP]
    r = row(db)
    assert r.status == endpoints_repo.FAILED
    assert r.failure_reason == ("The endpoint stayed Creating longer than 100 s "
                                "(EAGLENEST_ENDPOINT_TRANSITION_SECONDS); it was marked Failed.")
    with db.session() as s:  # a worker that finishes late changes nothing
        assert not endpoints_repo.mark_in_service(s, EP, {"Servers": {"late": {}}})
    assert row(db).status == endpoints_repo.FAILED


def test_an_update_past_the_bound_rolls_back(db):
    with db.session() as s:
        endpoints_repo.mark_in_service(s, EP, {"Servers": {"v": {"url": "u"}}})
    with db.session() as s:
        endpoints_repo.request_update(s, ACCOUNT, "ep", "c2", {"EndpointConfigName": "c2"})
    age(db, 101)
    with db.session() as s:
        assert endpoints_repo.time_out(s, 100) == [EP]
    r = row(db)
    assert (r.status, r.config_name, r.pending_config_name) == (
        endpoints_repo.IN_SERVICE, "c1", None)
    assert r.deployment == {"Servers": {"v": {"url": "u"}}}
    assert r.failure_reason == ("Update to c2 failed and was rolled back: The endpoint stayed "
                                "Updating longer than 100 s "
                                "(EAGLENEST_ENDPOINT_TRANSITION_SECONDS).")


def test_two_accounts_endpoints_of_one_name_change_apart(db):
    with db.session() as s:
        seed_endpoint(s, OTHER)
        with pytest.raises(ValidationException, match="Cannot create already existing "
                           f'endpoint "{OTHER_EP}"'):
            endpoints_repo.create(s, OTHER, {"EndpointName": "EP", "EndpointConfigName": "c1"})
    with db.session() as s:
        assert locate(s, EndpointRow, "ep") is None  # a bare name both have names neither
        assert not endpoints_repo.claim(s, "ep", endpoints_repo.CREATING, "w1", 60)
        assert endpoints_repo.claim(s, OTHER_EP, endpoints_repo.CREATING, "w2", 60)
        assert endpoints_repo.heartbeat(s, EP, "w2") is None
        assert endpoints_repo.mark_in_service(s, OTHER_EP, {"Servers": {"v": {}}})
    mine, theirs = row(db), row(db, OTHER.account_id)
    assert (mine.status, mine.owner, mine.deployment) == (endpoints_repo.CREATING, None, {})
    assert (theirs.status, theirs.deployment) == (endpoints_repo.IN_SERVICE, {"Servers": {"v": {}}})
    with db.session() as s:
        assert endpoints_repo.request_delete(s, OTHER, "ep") == OTHER_EP
        assert endpoints_repo.request_delete(s, ACCOUNT, "ep") is None  # nothing deployed
    with db.session() as s:
        endpoints_repo.finish_delete(s, OTHER_EP)
        assert s.query(EndpointRow).count() == 0


def test_a_long_failure_reason_is_cut_to_sagemakers_maximum(db):
    with db.session() as s:
        endpoints_repo.mark_failed(s, EP, "x" * 5000)
    assert row(db).status == endpoints_repo.FAILED
    assert row(db).failure_reason == "x" * 1024
