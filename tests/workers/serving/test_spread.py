"""Where a variant's instances go (workers/serving/spread.py share): one host when one can
take them all (this one first, else the tightest other, before anything starts here); over
several only when none can and together they can; the one-host path otherwise. And which
instances a host stops itself and which it hands to their hosts: a failed transition's and
a deleted endpoint's, whose row goes when the last host has stopped its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglenest.db import endpoint_spread, placement_repo
from eaglenest.db import endpoints_repo as eps
from eaglenest.db.migrate import upgrade_head
from eaglenest.db.session import Database
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation.accounts import ResourceRef
from eaglenest.foundation.host.children import Identity
from eaglenest.foundation.host.gpus import Gpu
from eaglenest.foundation.queue import ENDPOINT_DELETE_TASK, ENDPOINT_RETIRE_TASK, TaskQueue
from eaglenest.foundation.settings import Settings
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.serving import endpoints, fleet
from eaglenest.workers.serving.deploy import DeployError, VariantPlan
from eaglenest.workers.serving.spread import Nowhere, Share, every_server, share, split
from tests.support.endpoint_rows import ACCOUNT, EP, seed_endpoint


@pytest.fixture
def ctx(tmp_path: Path):  # type: ignore[no-untyped-def]
    settings = Settings(data_dir=tmp_path, host_name="host-a")
    upgrade_head(settings.resolved_database_url())
    c = WorkerContext(settings=settings, db=Database(settings.resolved_database_url()),
                      queue=TaskQueue("redis://127.0.0.1:9/0"), owner="me:1")
    yield c
    c.db.dispose()


def hosts(ctx: WorkerContext, **free: int) -> None:
    """A live serving worker per host with that many GPUs of 24 GiB."""
    ident = Identity.of(1) or Identity(1, 0)
    with ctx.db.session() as s:
        for i, (host, n) in enumerate(free.items()):
            gpus = tuple(Gpu(g, "A10G", 24.0) for g in range(n))
            placement_repo.register(s, placement_repo.WorkerInfo(
                f"vm:{i}", host.replace("_", "-"), ident, "train,serve", gpus))


def plan(itype: str = "ml.g5.2xlarge") -> VariantPlan:
    return VariantPlan(variant="v", model_name="m", weight=1.0, instance_count=3,
                       health_timeout=60, model_uri="s3://m/", head_uri=None,
                       instance_type=itype)


@pytest.mark.parametrize(("free", "remaining", "expected"), [
    ({"host_a": 4, "host_b": 4}, 3, Share(3)),  # this host can: all here
    ({"host_a": 2, "host_b": 4}, 3, Share(0, "host-b")),  # another can: all there
    ({"host_a": 1, "host_b": 4, "host_c": 3}, 3, Share(0, "host-c")),  # the tightest fit
    ({"host_a": 2, "host_b": 1, "host_c": 2}, 3, Share(2, "host-c")),  # spread: most room next
    ({"host_a": 0, "host_b": 1, "host_c": 2}, 3, Share(0, "host-c")),
])
def test_one_host_when_one_can_else_spread_when_together_they_can(ctx, free, remaining,
                                                                   expected):
    hosts(ctx, **free)
    assert share(ctx, plan(), remaining) == expected


def test_not_even_together_waits(ctx):
    hosts(ctx, host_a=2, host_b=1)
    with pytest.raises(Nowhere, match="4 instance"):
        share(ctx, plan(), 4)


def test_cpu_types_and_clusters_without_gpus_stay_on_one_host(ctx):
    hosts(ctx, host_a=1, host_b=1)
    assert share(ctx, plan("ml.m5.xlarge"), 3) == Share(3)
    assert share(ctx, plan(""), 3) == Share(3)  # serverless


def test_no_gpu_anywhere_runs_them_here(ctx):
    hosts(ctx, host_a=0, host_b=0)
    assert share(ctx, plan(), 3) == Share(3)


def test_each_host_stops_its_own(ctx):
    mine = {"unit": "a", "host": "host-a"}
    old = {"unit": "o"}  # recorded before hosts were: this host's
    theirs = {"unit": "b", "host": "host-b"}
    servers = {"v": {"instances": [mine, theirs]}, "w": {"instances": [old]}}
    here, away = split(ctx, servers)
    assert here == {"v": {"instances": [mine]}, "w": servers["w"]}
    assert away == {"host-b": [theirs]}
    dep = {"Servers": servers, "Shift": {"Servers": {"v": {"instances": [theirs]}}},
           "Placing": {"v": {"instances": [mine]}}}
    assert sorted(every_server(dep)) == ["placing:v", "shift:v", "v", "w"]


def _seed(ctx: WorkerContext) -> list[tuple[str, str, str]]:
    """Endpoint `ep` (Creating, claimed by ctx's worker), live hosts host-a and host-b; the
    tasks sent, as (task, ARN, queue)."""
    hosts(ctx, host_a=2, host_b=2)
    with ctx.db.session() as s:
        seed_endpoint(s, model_uri="s3://models/m/")
    with ctx.db.session() as s:
        assert eps.claim(s, EP, eps.CREATING, ctx.owner, 60)
    sent: list[tuple[str, str, str]] = []
    ctx.queue.send = lambda task, arn, queue, countdown=0: sent.append(  # type: ignore[method-assign]
        (task, arn, queue)) or True
    return sent


def _deployment(ctx: WorkerContext) -> dict:
    with ctx.db.session() as s:
        row = s.query(EndpointRow).filter_by(name="ep").one_or_none()
        return dict(row.deployment) if row is not None else {}


def test_a_failed_transition_has_each_host_stop_what_it_placed(ctx, monkeypatch):
    sent = _seed(ctx)
    b0 = {"unit": "v-x-0", "host": "host-b", "url": "http://127.0.0.1:9"}
    with ctx.db.session() as s:
        assert endpoint_spread.save_placing(s, EP, ctx.owner, eps.CREATING,
                                            {"v": {"instances": [b0]}})

    def boom(*_: object, **__: object) -> dict:
        raise DeployError("boom")

    monkeypatch.setattr(fleet, "start_variant", boom)
    with pytest.raises(DeployError):  # the second instance, on this host, fails to start
        fleet.launch(ctx, ResourceRef.parse(EP), "c1", {"v": {"DesiredInstanceCount": 2}},
                     eps.CREATING)
    assert _deployment(ctx) == {endpoint_spread.RETIRING: {"host-b": [b0]}}
    assert sent == [(ENDPOINT_RETIRE_TASK, EP, "serve.host-b")]


def test_a_delete_ends_when_every_host_has_stopped_its_instances(ctx, tmp_path):
    sent = _seed(ctx)
    a0 = {"unit": "v-x-0", "host": "host-a", "url": "http://127.0.0.1:9"}
    b0 = {"unit": "v-y-0", "host": "host-b", "url": "http://127.0.0.1:9"}
    with ctx.db.session() as s:
        assert eps.mark_in_service(s, EP, {"Servers": {"v": {"instances": [a0, b0]}}})
        assert eps.request_delete(s, ACCOUNT, "ep") == EP
    assert endpoints.delete(ctx, EP).startswith("deleting")
    assert _deployment(ctx) == {endpoint_spread.RETIRING: {"host-b": [b0]}}
    assert (ENDPOINT_RETIRE_TASK, EP, "serve.host-b") in sent
    on_b = WorkerContext(settings=Settings(data_dir=tmp_path / "b", host_name="host-b"),
                         db=ctx.db, queue=ctx.queue, owner="other:2")
    assert endpoints.retire(on_b, EP) == "retired 1"
    assert sent[-1] == (ENDPOINT_DELETE_TASK, EP, "serve")  # the delete removes the row now
    assert endpoints.delete(ctx, EP) == "deleted" and _deployment(ctx) == {}
