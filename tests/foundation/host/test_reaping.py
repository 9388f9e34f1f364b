"""Stopped children are waited for and dead ones are not counted (issue #51): the compute
ledger (foundation/host/threads.py) counts neither a zombie, nor a reused pid, nor a process
whose owner is gone; `children.stop_all` without the Popen leaves no zombie of its owner;
a child another live process spawned is left to that owner, whose `sweep` waits for it and
forgets its record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from eaglenest.foundation.host import children
from eaglenest.foundation.host.threads import ComputeLedger, ThreadPlan
from eaglenest.workers.serving.records import stop_servers
from tests.support.processes import zombies_of

PLAN = ThreadPlan(1, 2, 1, "auto")


def _wait(pred, timeout: float = 15) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)



def test_a_zombie_is_not_counted_and_its_entry_is_removed(tmp_path: Path) -> None:
    ledger = ComputeLedger(tmp_path / "ledger")
    proc = subprocess.Popen(["sleep", "300"])
    try:
        path = ledger.add(proc.pid, "serving:embedded", PLAN)
        assert ledger.running() == 1
        os.kill(proc.pid, signal.SIGKILL)  # not waited for: a zombie of this process
        _wait(lambda: proc.pid in zombies_of(os.getpid()))
        assert ledger.running() == 0 and not path.exists()
    finally:
        proc.kill()
        proc.wait()


def test_a_reused_pid_or_a_dead_owner_does_not_count(tmp_path: Path) -> None:
    ledger = ComputeLedger(tmp_path / "ledger")
    gone = subprocess.Popen(["true"])
    gone.wait()
    me, started = os.getpid(), children.start_time(os.getpid())
    assert started is not None
    dead_owner = {"pid": gone.pid, "start": 1, "host": children.HOST, "boot": children.BOOT}
    ledger.root.mkdir(parents=True)
    entries = {"reused": {"pid": me, "start": started - 1, "owner": None},
               "orphan": {"pid": me, "start": started, "owner": dead_owner},
               "older": {"pid": me}}  # written before entries had a start time: counts
    for name, entry in entries.items():
        (ledger.root / f"{me}-{name}.json").write_text(json.dumps(entry))
    assert ledger.running() == 1
    assert sorted(p.name for p in ledger.root.iterdir()) == [f"{me}-older.json"]
    path = ledger.add(me, "training", PLAN, key="mine")  # its owner (this process) runs
    assert json.loads(path.read_text())["owner"]["pid"] == me
    assert ledger.running() == 2


def test_stop_all_without_the_popen_leaves_no_zombie(tmp_path: Path) -> None:
    proc, record = children.spawn(["sleep", "300"], role="test", resource="t",
                                  children_dir=tmp_path)
    pid = proc.pid
    del proc  # like a fleet stopped by its deployment record: the Popen is long dropped
    assert children.stop_all([record], timeout=5) == [record]
    assert pid not in zombies_of(os.getpid()) and children.start_time(pid) is None
    # a child of ours whose Popen was never known here: waited for by its pid
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    started = children.start_time(other.pid)
    assert started is not None
    rec = children.ChildRecord(pid=other.pid, start=started, tag="none", role="test",
                               resource="t", owner=children.myself())
    children.stop_all([rec], timeout=5)
    assert other.pid not in zombies_of(os.getpid())
    assert other.poll() == 0  # Popen copes: its child was already waited for


OWNER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from eaglenest.foundation.host import children
    children_dir = Path({children_dir!r})
    proc, record = children.spawn(["sleep", "300"], role="test", resource="t",
                                  children_dir=children_dir)
    del proc
    print(record.tag, flush=True)
    while True:  # the worker's watchdog, faster
        for gone in children.sweep(children_dir):
            print("swept", gone.pid, flush=True)
        time.sleep(0.1)
""")


def test_a_child_of_another_live_owner_is_left_to_its_sweep(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER.format(children_dir=str(tmp_path))],
                             stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[2])
    try:
        assert owner.stdout is not None
        tag = owner.stdout.readline().strip()
        (record,) = children.records(tmp_path)
        assert record.tag == tag and children.owned_elsewhere(record)
        # another process stops it (a delete task on another worker of this host)
        stop_servers({"v": {"instances": [{"child": record.to_dict()}]}}, tmp_path)
        assert record.running() == []
        assert owner.stdout.readline().strip() == f"swept {record.pid}"
        assert zombies_of(owner.pid) == [] and children.records(tmp_path) == []
    finally:
        owner.kill()
        owner.wait()
