"""GPU placement in the database: all-or-none takes that never double-book under concurrent
placements, release, reclaim of dead workers only, and release of ended holders."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

from sqlalchemy import update

from eaglenest.db import placement_repo as repo
from eaglenest.db.repository import now
from eaglenest.db.session import Database
from eaglenest.db.tables import GpuHoldingRow, WorkerRow
from eaglenest.foundation.host.children import BOOT, HOST, Identity, start_time
from eaglenest.foundation.host.gpus import Gpu

GPUS = tuple(Gpu(i, "A10G", 24.0) for i in range(6))


def worker(owner: str = "vm:1", host: str = "host-a", gpus: tuple[Gpu, ...] = GPUS,
           ident: Identity | None = None, queues: str = "train,serve") -> repo.WorkerInfo:
    return repo.WorkerInfo(owner, host, ident or Identity.of(1) or Identity(1, 0), queues,
                           gpus)


def test_take_is_all_or_none_and_checks_memory(db: Database) -> None:
    w = worker(gpus=(Gpu(0, "A10G", 24.0), Gpu(1, "T4", 16.0), Gpu(2, "A10G", 24.0)))
    with db.session() as s:
        repo.register(s, w)
        assert repo.take(s, w, "arn:ep", "u0", 3, 24.0) is None  # the T4 is too small
        assert repo.take(s, w, "arn:ep", "u0", 2, 24.0) == [0, 2]
        assert repo.take(s, w, "arn:ep", "u1", 1, 24.0) is None  # nothing taken
        assert repo.take(s, w, "arn:ep", "u1", 1, 16.0) == [1]
        assert repo.held(s, "arn:ep") == {"u0": [0, 2], "u1": [1]}
        assert repo.release(s, "arn:ep", ["u0"]) == 2
        assert repo.held(s, "arn:ep") == {"u1": [1]}


def test_concurrent_takes_never_share_a_gpu(db: Database) -> None:
    a, b = worker("vm:1", "host-a", GPUS[:2]), worker("vm:2", "host-b", GPUS[:4])
    with db.session() as s:
        repo.register(s, a)
        repo.register(s, b)
    got: list[tuple[str, list[int] | None]] = []
    barrier = threading.Barrier(20)

    def place(i: int) -> None:
        w = (a, b)[i % 2]
        barrier.wait()
        with db.session() as s:
            got.append((w.host, repo.take(s, w, f"arn:ep-{i}", "u", 1, 24.0)))

    threads = [threading.Thread(target=place, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    placed = [(host, gpus[0]) for host, gpus in got if gpus]
    assert len(placed) == 6 and len(set(placed)) == 6
    with db.session() as s:
        rows = [(h.host, h.gpu_index) for h in repo.holdings(s)]
    assert sorted(rows) == sorted(placed)


def test_a_dead_workers_gpus_are_reclaimed_and_a_live_ones_are_not(db: Database) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    ident = Identity.of(gone.pid)
    gone.wait()
    assert ident is not None
    live, dead = worker("vm:live"), worker("vm:dead", "host-b", ident=ident)
    silent = worker("elsewhere:9", "host-c", ident=Identity(9, 9, "elsewhere", "boot"))
    with db.session() as s:
        for w in (live, dead, silent):
            repo.register(s, w)
            repo.take(s, w, f"arn:{w.owner}", "u", 2, 24.0)
        # another machine's worker is judged by its heartbeat alone: fresh, so kept
        assert repo.reclaim(s, lease_seconds=60) == ["vm:dead"]
        assert sorted({h.owner for h in repo.holdings(s)}) == ["elsewhere:9", "vm:live"]
        # late heartbeats: another machine's worker is presumed dead, a live local one not
        s.execute(update(WorkerRow).values(heartbeat_time=now() - 120))
        assert repo.reclaim(s, lease_seconds=60) == ["elsewhere:9"]
        assert {h.owner for h in repo.holdings(s)} == {"vm:live"}
        assert repo.live_workers(s, 60) == []  # none heartbeat: none is offered work


def test_a_worker_in_another_pid_namespace_of_this_host_is_judged_by_heartbeat(
        db: Database) -> None:
    """Containers sharing the host's name (host networking) each number their pids from 1:
    a worker there is another machine to this one (foundation/host/children.py ``machine``),
    so its pid 1 is never looked up in this process's /proc."""
    ns = os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]")
    assert f"{socket.gethostname()}/{ns}" == HOST
    other = Identity(1, (start_time(1) or 0) + 1, f"{socket.gethostname()}/1{ns}", BOOT)
    assert not other.local() and not other.alive()
    w = worker(f"{other.host}:1", "host-a", ident=other)
    with db.session() as s:
        repo.register(s, w)
        repo.take(s, w, "arn:ep", "u", 1, 24.0)
        assert repo.reclaim(s, lease_seconds=60) == []  # its heartbeat is fresh
        s.execute(update(WorkerRow).values(heartbeat_time=now() - 120))
        assert repo.reclaim(s, lease_seconds=60) == [w.owner]


def test_holdings_of_ended_or_missing_holders_are_released(db: Database) -> None:
    w = worker()
    with db.session() as s:
        repo.register(s, w)
        repo.take(s, w, "arn:aws:sagemaker:us-east-1:123456789012:endpoint/gone", "u", 1, 24)
        assert repo.release_orphans(s, grace_seconds=60) == []  # young: may be in flight
        s.execute(update(GpuHoldingRow).values(since=now() - 120))
        assert repo.release_orphans(s, grace_seconds=60) == [
            "arn:aws:sagemaker:us-east-1:123456789012:endpoint/gone"]
        assert repo.holdings(s) == []


def test_hosts_that_fit(db: Database) -> None:
    a = worker("vm:1", "host-a", GPUS[:2])
    b = worker("vm:2", "host-b", GPUS[:4], queues="serve")
    with db.session() as s:
        repo.register(s, a)
        repo.register(s, b)
        repo.take(s, b, "arn:x", "u", 3, 24.0)
        assert repo.hosts_that_fit(s, "serve", 2, 24.0, 60) == (["host-a"], ["host-a", "host-b"])
        assert repo.hosts_that_fit(s, "train", 2, 24.0, 60) == (["host-a"], ["host-a"])
        assert repo.hosts_that_fit(s, "serve", 4, 24.0, 60) == ([], ["host-b"])
        assert repo.hosts_that_fit(s, "serve", 1, 80.0, 60) == ([], [])
        assert repo.any_gpus(s, 60)
