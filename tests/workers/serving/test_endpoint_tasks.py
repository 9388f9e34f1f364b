"""Endpoint tasks (workers/serving/endpoints.py) on a real SQLite database, without serving: any
exception while starting servers ends the transition (Failed with the reason, or an
update's rollback), a transition another live worker holds is left alone, and a task works
on the endpoint its ARN names (its account's config, model and files), a bare name only
while one account has it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from eaglenest.db import endpoints_repo
from eaglenest.db.migrate import upgrade_head
from eaglenest.db.session import Database
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation.queue import TaskQueue
from eaglenest.foundation.settings import Settings
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.serving import endpoints, fleet, spread
from tests.support.endpoint_rows import ACCOUNT, EP, OTHER, OTHER_EP, seed_endpoint


@pytest.fixture
def ctx(tmp_path: Path):  # type: ignore[no-untyped-def]
    settings = Settings(data_dir=tmp_path)
    upgrade_head(settings.resolved_database_url())
    c = WorkerContext(settings=settings, db=Database(settings.resolved_database_url()),
                      queue=TaskQueue("redis://127.0.0.1:9/0"), owner="me:1")
    with c.db.session() as s:
        seed_endpoint(s)
    yield c
    c.db.dispose()


def row(ctx: WorkerContext, account: str = ACCOUNT.account_id) -> EndpointRow:
    with ctx.db.session() as s:
        r = s.query(EndpointRow).filter_by(name="ep", account_id=account).one()
        s.expunge(r)
        return r


def boom(*_: object) -> dict:
    raise RuntimeError("boom")


def test_an_unexpected_error_fails_the_creation_with_the_reason(ctx, monkeypatch):
    monkeypatch.setattr(fleet, "launch", boom)
    assert endpoints.create(ctx, EP) == endpoints_repo.FAILED
    r = row(ctx)
    assert (r.status, r.failure_reason, r.owner) == (
        endpoints_repo.FAILED, "Internal error: RuntimeError: boom", None)


def test_an_unexpected_error_rolls_an_update_back(ctx, monkeypatch):
    with ctx.db.session() as s:
        endpoints_repo.mark_in_service(s, EP, {"Servers": {}})
        endpoints_repo.request_update(s, ACCOUNT, "ep", "c2", {"EndpointConfigName": "c2"})
    monkeypatch.setattr(fleet, "launch", boom)
    assert endpoints.update(ctx, EP) == "rolled-back"
    r = row(ctx)
    assert (r.status, r.config_name, r.pending_config_name) == (
        endpoints_repo.IN_SERVICE, "c1", None)
    assert r.failure_reason == ("Update to c2 failed and was rolled back: Internal error: "
                                "RuntimeError: boom")


def test_a_transition_another_live_worker_holds_is_left_alone(ctx, monkeypatch):
    with ctx.db.session() as s:
        assert endpoints_repo.claim(s, EP, endpoints_repo.CREATING, "other:2", 60)
    monkeypatch.setattr(fleet, "launch", boom)
    assert endpoints.create(ctx, EP).startswith("skipped")
    r = row(ctx)
    assert (r.status, r.owner) == (endpoints_repo.CREATING, "other:2")


def test_two_deliveries_to_one_worker_start_the_servers_once(ctx, monkeypatch):
    """The API's message and the one reconcile re-sends at worker start both reach this
    worker's pool: the second task finds the first holding the transition and does nothing
    (before, both launched and one fleet was left running outside the deployment)."""
    launched, second_done = [], threading.Event()

    def launch(*_: object) -> dict:
        launched.append(threading.current_thread().name)
        assert second_done.wait(30), "the second task did not return while the first ran"
        return {"Servers": {}}

    monkeypatch.setattr(fleet, "launch", launch)
    results: list[str] = []
    first = threading.Thread(target=lambda: results.append(endpoints.create(ctx, EP)))
    first.start()
    deadline = time.monotonic() + 30
    while not launched and time.monotonic() < deadline:
        time.sleep(0.01)
    second = endpoints.create(ctx, EP)
    second_done.set()
    first.join(30)
    assert second.startswith("skipped")
    assert (results, len(launched)) == ([endpoints_repo.IN_SERVICE], 1)
    r = row(ctx)
    assert (r.status, r.owner) == (endpoints_repo.IN_SERVICE, None)
    # the hold ended with the task: the next transition of the endpoint is claimed again
    with ctx.db.session() as s:
        endpoints_repo.request_update(s, ACCOUNT, "ep", "c2", {"EndpointConfigName": "c2"})
    monkeypatch.setattr(fleet, "launch", boom)
    assert endpoints.update(ctx, EP) == "rolled-back"


def test_a_delete_proceeds_while_a_create_of_this_worker_still_holds_its_lease(ctx,
                                                                            monkeypatch):
    """The in-process hold is per (endpoint, status): a DeleteEndpoint accepted while the
    create still runs (as after an update marks InService and stops its old servers) is
    not held back by it, and the create then stops what it started."""
    deleted: list[str] = []
    stopped: list[dict] = []

    def launch(*_: object) -> dict:
        with ctx.db.session() as s:  # as if its servers were recorded (else no task deletes)
            s.query(EndpointRow).filter_by(name="ep", account_id=ACCOUNT.account_id).one(
            ).deployment = {"Servers": {}}
        with ctx.db.session() as s:
            assert endpoints_repo.request_delete(s, ACCOUNT, "ep") is not None
        deleted.append(endpoints.delete(ctx, EP))
        return {"Servers": {"AllTraffic": {"instances": []}}}

    monkeypatch.setattr(fleet, "launch", launch)
    monkeypatch.setattr(spread, "stop_servers", lambda servers, *_: stopped.append(servers))
    assert endpoints.create(ctx, EP) == "deleted-while-creating"
    assert deleted == ["deleted"]
    assert stopped[-1] == {"AllTraffic": {"instances": []}}
    with ctx.db.session() as s:
        assert s.query(EndpointRow).filter_by(name="ep", account_id=ACCOUNT.account_id
                                              ).one_or_none() is None


def test_an_update_accepted_while_the_last_one_retires_its_fleet_is_not_skipped(ctx,
                                                                               monkeypatch):
    """UpdateEndpoint accepted the moment the previous update is InService, while that task
    still stops the old fleet: the new update's task runs at once (before, it found the
    lease of (endpoint, Updating) held in this worker and was skipped)."""
    with ctx.db.session() as s:
        endpoints_repo.mark_in_service(s, EP, {"Servers": {"AllTraffic": {"instances": []}}})
        endpoints_repo.request_update(s, ACCOUNT, "ep", "c2", {"EndpointConfigName": "c2"})
    new_fleet = {"Servers": {"AllTraffic": {"instances": []}}, "ProductionVariants": []}
    launched: list[str] = []
    second: list[str] = []
    stopped: list[dict] = []

    def launch(_ctx: object, _ep: object, config: str, *_: object) -> dict:
        launched.append(config)
        return new_fleet

    def stop(servers: dict, *_: object) -> None:
        if stopped:  # the second update's retired fleet
            return
        stopped.append(servers)  # the first update's old fleet: a new update comes in now
        with ctx.db.session() as s:
            endpoints_repo.request_update(s, ACCOUNT, "ep", "c1", {"EndpointConfigName": "c1"})
        second.append(endpoints.update(ctx, EP))

    monkeypatch.setattr(fleet, "launch", launch)
    monkeypatch.setattr(spread, "stop_servers", stop)
    assert endpoints.update(ctx, EP) == endpoints_repo.IN_SERVICE
    assert second == [endpoints_repo.IN_SERVICE] and launched == ["c2", "c1"]
    r = row(ctx)
    assert (r.status, r.config_name, r.owner) == (endpoints_repo.IN_SERVICE, "c1", None)


def test_a_bare_name_is_taken_only_while_one_account_has_it(ctx, monkeypatch):
    """A task queued before names were per account carries a bare name."""
    monkeypatch.setattr(fleet, "launch", boom)
    assert endpoints.create(ctx, "ep") == endpoints_repo.FAILED
    assert row(ctx).status == endpoints_repo.FAILED
    with ctx.db.session() as s:
        seed_endpoint(s, OTHER)
    assert endpoints.delete(ctx, "ep") == "skipped (no such endpoint)"
    assert endpoints.create(ctx, "EP") == "skipped (no such endpoint)"
    assert row(ctx, OTHER.account_id).status == endpoints_repo.CREATING


def test_the_arn_picks_the_account_of_config_model_and_files(ctx, monkeypatch):
    """Two accounts' endpoints `ep` on configs `c1` of models `m`: the other account's task
    deploys its own model into its own folder and leaves the first endpoint alone."""
    with ctx.db.session() as s:
        seed_endpoint(s, OTHER, model_uri="s3://other-models/m/")
    started = []

    def start_variant(store, workdir, endpoint, plan, *args, **kwargs):  # type: ignore[no-untyped-def]
        started.append((workdir, endpoint, plan.model_uri, kwargs.get("resource")))
        return {"instances": [{"url": "http://127.0.0.1:1"}]}

    monkeypatch.setattr(fleet, "start_variant", start_variant)
    assert endpoints.create(ctx, OTHER_EP) == endpoints_repo.IN_SERVICE
    assert started == [(ctx.settings.data_dir / "endpoints" / OTHER.account_id / "ep", "ep",
                        "s3://other-models/m/", f"endpoint:{OTHER.account_id}/ep")]
    assert row(ctx, OTHER.account_id).status == endpoints_repo.IN_SERVICE
    assert (row(ctx).status, row(ctx).deployment) == (endpoints_repo.CREATING, {})
