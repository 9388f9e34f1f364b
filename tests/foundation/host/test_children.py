"""Owned child processes (foundation/host/children.py): a stopped child takes its whole tree with it
(grandchildren in other sessions too), a record that does not match the live process is
never signalled, children die with the process that spawned them, and what a SIGKILLed
owner left behind is reaped from its records."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from eaglenest.foundation.host import children

TREE = ["bash", "-c", "sleep 300 & setsid sleep 300 & wait"]


def _wait(pred, timeout: float = 15) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_stop_ends_the_whole_tree_and_forgets_the_record(tmp_path: Path) -> None:
    proc, record = children.spawn(TREE, role="test", resource="t", children_dir=tmp_path)
    _wait(lambda: len(record.running()) == 3)  # bash, its sleep, the setsid sleep
    assert (tmp_path / f"{record.tag}.json").is_file()
    assert children.records(tmp_path) == [record]
    assert children.stop(record, timeout=5, proc=proc)
    children.forget(tmp_path, record)
    assert record.running() == [] and children.tagged(record.tag) == []
    assert children.records(tmp_path) == []


def test_a_record_that_does_not_match_is_never_signalled(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        started = children.start_time(proc.pid)
        assert started is not None
        real = children.ChildRecord(pid=proc.pid, start=started, tag="none", role="test",
                                    resource="t")
        for stale in (dataclasses.replace(real, start=started - 1),  # the pid was reused
                      dataclasses.replace(real, host="another-host"),
                      dataclasses.replace(real, boot="an-earlier-boot")):
            assert stale.running() == []
            children.stop(stale, timeout=1)
            assert proc.poll() is None, stale
        assert children.stop(real, timeout=5, proc=proc)
        assert proc.returncode == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


OWNER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from eaglenest.foundation.host import children
    proc, record = children.spawn({argv!r}, role="test", resource="t",
                                  children_dir=Path({children_dir!r}), scratch_env={scratch!r})
    print(record.tag, flush=True)
    time.sleep(300)
""")


def _owner(tmp_path: Path, argv: list[str], scratch: tuple[str, ...] = ()
           ) -> tuple[subprocess.Popen[str], str]:
    """A process that spawns `argv` as its child, then waits; and the child's tag."""
    code = OWNER.format(argv=argv, children_dir=str(tmp_path), scratch=scratch)
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[2])
    assert owner.stdout is not None
    return owner, owner.stdout.readline().strip()


def test_children_die_with_their_owner_and_leftovers_are_reaped(tmp_path: Path) -> None:
    owner, tag = _owner(tmp_path, TREE)
    _wait(lambda: len(children.tagged(tag)) == 3)
    owner.kill()  # SIGKILL: no handler runs
    owner.wait()
    # bash (the direct child) dies with its owner; its sleeps were not told to
    _wait(lambda: len(children.tagged(tag)) == 2)
    (record,) = children.records(tmp_path)
    assert record.owner is not None and record.owner.pid == owner.pid
    assert children.reap(tmp_path) == [record]
    assert children.tagged(tag) == [] and children.records(tmp_path) == []


def test_reap_leaves_the_children_of_a_live_owner(tmp_path: Path) -> None:
    owner, tag = _owner(tmp_path, ["sleep", "300"])
    try:
        assert children.reap(tmp_path) == []
        assert len(children.tagged(tag)) == 1 and len(children.records(tmp_path)) == 1
    finally:
        owner.kill()
        owner.wait()
    _wait(lambda: children.tagged(tag) == [])  # PR_SET_PDEATHSIG
    assert os.path.isdir(tmp_path)


def test_a_prefork_worker_refuses_the_serve_queue(tmp_path: Path) -> None:
    """A prefork pool process exits after each task, and serving processes die with it."""
    env = {**os.environ, "EAGLENEST_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "eaglenest.cli", "worker", "--pool", "prefork",
                           "--queues", "train,serve"], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=60)
    assert done.returncode == 2
    assert "--pool prefork cannot consume the serve queue" in done.stderr
    assert not (tmp_path / "eaglenest.db").exists()  # refused before touching anything


def test_a_paused_child_gets_its_sigterm_not_the_sigkill(tmp_path: Path) -> None:
    """A child paused with SIGSTOP (the benchmark stage pauses the servers it is not
    measuring) is continued after its SIGTERM, so it exits through its handler at once
    rather than being SIGKILLed when the timeout runs out."""
    ready, bye = tmp_path / "ready", tmp_path / "bye"
    code = textwrap.dedent(f"""
        import signal, sys, time
        def handler(*_):
            open({str(bye)!r}, "w").write("bye")
            sys.exit(0)
        signal.signal(signal.SIGTERM, handler)
        open({str(ready)!r}, "w").write("ready")
        time.sleep(300)
    """)
    proc, record = children.spawn([sys.executable, "-c", code], role="test", resource="t")
    _wait(ready.exists)
    os.killpg(proc.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    assert children.stop(record, timeout=10, proc=proc)
    assert bye.read_text() == "bye" and time.monotonic() - t0 < 5
    assert proc.returncode == 0


SCRATCH_CHILD = ["bash", "-c", 'touch "$SCRATCH_A/socket" && test "$SCRATCH_A" = "$SCRATCH_B" '
                 "&& sleep 300"]


def test_a_scratch_folder_lives_and_goes_with_its_child(tmp_path: Path) -> None:
    proc, record = children.spawn(SCRATCH_CHILD, role="test", resource="t", children_dir=tmp_path,
                                  scratch_env=("SCRATCH_A", "SCRATCH_B"))
    scratch = Path(record.scratch)
    assert scratch.name.startswith(children.SCRATCH_PREFIX)
    _wait(lambda: (scratch / "socket").exists())
    assert children.records(tmp_path)[0].scratch == str(scratch)
    assert proc.poll() is None  # both variables name the one folder
    assert children.stop(record, timeout=5, proc=proc)
    assert not scratch.exists()
    done, plain = children.spawn(["true"], role="test", resource="t")
    done.wait()
    assert plain.scratch == ""


def test_reaping_a_dead_owners_child_removes_its_scratch_folder(tmp_path: Path) -> None:
    owner, tag = _owner(tmp_path, SCRATCH_CHILD, ("SCRATCH_A", "SCRATCH_B"))
    (record,) = children.records(tmp_path)
    scratch = Path(record.scratch)
    _wait(lambda: (scratch / "socket").exists())
    owner.kill()
    owner.wait()
    _wait(lambda: children.tagged(tag) == [])  # bash dies with its owner
    assert children.reap(tmp_path) == [] and children.records(tmp_path) == []
    assert not scratch.exists()
