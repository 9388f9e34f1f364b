"""Child processes EagleNest starts (serving instances, benchmark model servers, torchrun and
its ranks): started so that they die with their owner, recorded so that they are never
confused with another process, stopped with their whole tree.

Contract:
- `spawn()` starts a child in a process group of its own (pgid = its pid) with the parent
  death signal set to SIGKILL (Linux `PR_SET_PDEATHSIG`): the child dies when the process
  that started it dies, SIGKILL included. The kernel ties that signal to the thread that
  forked, so every fork runs on one long-lived thread of the owner process
  (foundation/host/forking.py). The child's
  environment carries ``EAGLENEST_CHILD_TAG=<tag>``; its descendants inherit it (torchrun's
  ranks, a model server's helpers) and are found by it even after they leave the group.
- A `ChildRecord` names a child by host, boot id (``/proc/sys/kernel/random/boot_id``), pid,
  the pid's start time (field 22 of ``/proc/<pid>/stat``) and its tag. `stop()` signals
  nothing when host or boot id are not this machine's; it signals the process group only
  while the leader's start time still matches, and any other live process carrying the
  tag. A record from another host, an earlier boot or a reused PID is never signalled.
- With a children_dir a record is also the file ``<children_dir>/<tag>.json`` naming its
  owner (the process that spawned it, by the same identity) until `forget()`. `reap()` stops
  the children of owners that are no longer alive: a SIGKILLed worker's leftovers are
  stopped by the next worker that starts on this host.
- Stopped children leave no zombie: `stop_all` waits for each leader this process spawned
  (by its Popen when known, which keeps the exit status for its holder, else by pid; only
  a zombie with the recorded start time). Another live owner's child, and its record, are
  left to it (`owned_elsewhere`): its periodic `sweep()` waits for its exited leaders and
  forgets the records of trees that are gone.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eaglenest.foundation.host.forking import Spawner, die_with_parent

log = logging.getLogger("eaglenest.children")

TAG_ENV = "EAGLENEST_CHILD_TAG"
SCRATCH_PREFIX = "eaglenest-child-"


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_namespace() -> str:
    """This process's PID namespace as its inode number ("pid:[4026532519]" ->
    "4026532519"); "" where it cannot be read."""
    try:
        return os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]")
    except OSError:
        return ""


def machine() -> str:
    """Where a pid names one process: the host name plus the PID namespace where it can be
    read. Containers may share a host's name (host networking) and each number their own
    pids from 1, so two workers there are told apart, and neither judges the other's pids by
    its own /proc. Example: "gpu-7/4026532519"; "gpu-7" without /proc."""
    ns = pid_namespace()
    return f"{socket.gethostname()}/{ns}" if ns else socket.gethostname()


HOST, BOOT = machine(), boot_id()


def _stat(pid: int) -> tuple[str, int] | None:
    """The pid's state letter and start time in clock ticks after boot (None: no such pid)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    """The pid's start time in clock ticks after boot; None when it is gone (or a zombie)."""
    stat = _stat(pid)
    return None if stat is None or stat[0] in ("Z", "X") else stat[1]


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def tagged(tag: str) -> list[int]:
    """Live processes whose environment carries this tag (zombies excluded)."""
    marker = f"{TAG_ENV}={tag}".encode()
    me = os.getpid()
    return [pid for pid in _pids() if pid != me and _environ_has(pid, marker)
            and start_time(pid) is not None]


def _pids() -> Iterator[int]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield int(entry.name)


@dataclass(frozen=True)
class Identity:
    """A process as it is known beyond its pid."""

    pid: int
    start: int
    host: str = HOST
    boot: str = BOOT

    @classmethod
    def of(cls, pid: int) -> Identity | None:
        started = start_time(pid)
        return None if started is None else cls(pid, started)

    def local(self) -> bool:
        return self.host == HOST and self.boot == BOOT

    def alive(self) -> bool:
        """The very same process still runs (on this host, since this boot)."""
        return self.local() and start_time(self.pid) == self.start


@functools.cache
def _identity(pid: int) -> Identity | None:
    return Identity.of(pid)


def myself() -> Identity | None:
    """This process (a forked child is a new one: the cache is cleared in it)."""
    return _identity(os.getpid())


os.register_at_fork(after_in_child=_identity.cache_clear)


@dataclass(frozen=True)
class ChildRecord:
    pid: int
    start: int
    tag: str
    role: str
    resource: str
    host: str = HOST
    boot: str = BOOT
    owner: Identity | None = None
    #: the tree's private temporary folder ("" if none): removed once the tree is stopped
    scratch: str = ""

    @property
    def identity(self) -> Identity:
        return Identity(self.pid, self.start, self.host, self.boot)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ChildRecord:
        owner = raw.get("owner")
        return cls(**{**raw, "owner": Identity(**owner) if owner else None})

    def running(self) -> list[int]:
        """Its live processes: the leader if still the same process, plus tagged ones."""
        if not self.identity.local():
            return []
        found = set(tagged(self.tag))
        if self.identity.alive():
            found.add(self.pid)
        return sorted(found)


_spawner = Spawner()
#: the Popen of each child this process spawned, while anything holds it (a running one
#: dropped by its holder stays held by subprocess's own list until it is waited for)
_procs: weakref.WeakValueDictionary[int, subprocess.Popen[bytes]] = weakref.WeakValueDictionary()


def spawn(argv: list[str], *, role: str, resource: str, children_dir: Path | None = None,
          env: dict[str, str] | None = None, scratch_env: tuple[str, ...] = (), **popen: Any
          ) -> tuple[subprocess.Popen[bytes], ChildRecord]:
    """Start `argv` as an owned child (module docstring); `popen` goes to Popen. With
    `scratch_env`, those variables name a new private temporary folder (the place for
    the tree's sockets and temporary files, e.g. vLLM's VLLM_RPC_BASE_PATH), removed
    when the child is stopped or its record reaped."""
    tag = uuid.uuid4().hex
    child_env = {**(os.environ if env is None else env), TAG_ENV: tag}
    scratch = tempfile.mkdtemp(prefix=SCRATCH_PREFIX) if scratch_env else ""
    child_env.update(dict.fromkeys(scratch_env, scratch))
    me = os.getpid()
    try:
        proc = _spawner.run(lambda: subprocess.Popen(
            argv, env=child_env, start_new_session=True,
            preexec_fn=lambda: die_with_parent(me), **popen))
    except BaseException:
        _clear_scratch(scratch)
        raise
    _procs[proc.pid] = proc
    record = ChildRecord(pid=proc.pid, start=start_time(proc.pid) or 0, tag=tag, role=role,
                         resource=resource, owner=myself(), scratch=scratch)
    if children_dir is not None:
        remember(children_dir, record)
    return proc, record


def _clear_scratch(scratch: str) -> None:
    """Remove a child's scratch folder: only one `spawn` made (its name says so)."""
    if scratch and Path(scratch).name.startswith(SCRATCH_PREFIX):
        shutil.rmtree(scratch, ignore_errors=True)


def _clear_stopped(recs: list[ChildRecord]) -> None:
    """The scratch folders of those trees that are gone (a SIGKILL that failed keeps it)."""
    for r in recs:
        if not r.running():
            _clear_scratch(r.scratch)


def remember(children_dir: Path, record: ChildRecord) -> None:
    children_dir.mkdir(parents=True, exist_ok=True)
    part = children_dir / f"{record.tag}.json.part"
    part.write_text(json.dumps(record.to_dict()))
    part.replace(children_dir / f"{record.tag}.json")


def forget(children_dir: Path | None, record: ChildRecord) -> None:
    if children_dir is not None:
        (children_dir / f"{record.tag}.json").unlink(missing_ok=True)


def records(children_dir: Path) -> list[ChildRecord]:
    out = []
    for path in sorted(children_dir.glob("*.json")) if children_dir.is_dir() else []:
        try:
            out.append(ChildRecord.from_dict(json.loads(path.read_text())))
        except (OSError, ValueError, TypeError) as exc:
            log.warning("unreadable child record %s: %s", path, exc)
    return out


def _signal(pids: list[int], leader: int | None, sig: signal.Signals) -> None:
    if leader is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop(record: ChildRecord, timeout: float = 20,
         proc: subprocess.Popen[bytes] | None = None) -> bool:
    """SIGTERM (then SIGCONT, for a paused one) the child's tree, SIGKILL what is left after
    `timeout`; wait until it is gone.
    False (and nothing signalled) when the record is not of this host and boot."""
    return bool(stop_all([record], timeout, [proc] if proc is not None else []))


def stop_all(recs: list[ChildRecord], timeout: float = 20,
             procs: list[subprocess.Popen[bytes]] | None = None) -> list[ChildRecord]:
    """`stop()` for several children at once (signalled together, waited for together);
    the ones of this host and boot, the only ones signalled."""
    local = [r for r in recs if r.identity.local()]
    for r in recs:
        if r not in local:
            log.warning("not stopping %s pid %d of %s: it runs on host %s (boot %s), not here",
                        r.role, r.pid, r.resource, r.host, r.boot)
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        running = {r: r.running() for r in local}
        if not any(running.values()):
            break
        for r, pids in running.items():
            if pids:
                leader = r.pid if r.identity.alive() else None
                _signal(pids, leader, sig)
                if sig == signal.SIGTERM:  # a paused (SIGSTOP) process acts on it once continued
                    _signal(pids, leader, signal.SIGCONT)
        _await(local, procs or [], time.monotonic() + wait)
    for p in procs or []:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=1)
    for r in local:
        _collect(r)
    _clear_stopped(local)
    return local


def _await(local: list[ChildRecord], procs: list[subprocess.Popen[bytes]], deadline: float
           ) -> None:
    """Until these trees are gone or `deadline` passes, waiting for our own exited ones."""
    while any(r.running() for r in local) and time.monotonic() < deadline:
        for p in procs:
            p.poll()  # reap our own child: a zombie is gone
        for r in local:
            _collect(r)
        time.sleep(0.1)


def _collect(record: ChildRecord) -> None:
    """Wait for the record's leader if it has exited and this process spawned it (module
    docstring): only the zombie that started when the record says, never a reused pid."""
    if record.owner != myself() or _stat(record.pid) != ("Z", record.start):
        return
    proc = _procs.get(record.pid)
    if proc is not None:
        proc.poll()  # sets its returncode: whoever holds it still learns how it ended
    else:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(record.pid, os.WNOHANG)


def owned_elsewhere(record: ChildRecord) -> bool:
    """Whether another live process of this host spawned the child: only that owner can
    wait for its leader, and its `sweep()` forgets the record."""
    return record.owner is not None and record.owner != myself() and record.owner.alive()


def sweep(children_dir: Path) -> list[ChildRecord]:
    """Wait for the exited leaders this process spawned (one that crashed, one another
    process stopped) and forget the records of trees that are gone; those forgotten.
    Running trees and other owners' records are left alone."""
    gone = []
    for record in records(children_dir):
        if record.owner != myself() or record.identity.alive():
            continue
        _collect(record)
        if not record.running():
            _clear_scratch(record.scratch)
            forget(children_dir, record)
            gone.append(record)
    return gone


def reap(children_dir: Path) -> list[ChildRecord]:
    """Stop the recorded children whose owner is gone (and drop records of an earlier boot);
    the stopped ones. Records of live owners and of other hosts are left alone."""
    reaped = []
    for record in records(children_dir):
        if record.host != HOST:
            continue  # a data dir shared with another host: its worker judges its own
        if record.boot == BOOT and record.owner is not None and record.owner.alive():
            continue
        if record.boot == BOOT and record.running():
            log.warning("stopping %s pid %d of %s left behind by dead worker pid %s",
                        record.role, record.pid, record.resource,
                        record.owner.pid if record.owner else "?")
            stop(record, timeout=10)  # its scratch folder goes with it
            reaped.append(record)
        else:  # an earlier boot's record or a tree that is gone
            _clear_scratch(record.scratch)
        forget(children_dir, record)
    return reaped


def stop_owned(children_dir: Path) -> None:
    """Stop every recorded child this process spawned (a worker's graceful shutdown)."""
    for record in records(children_dir):
        if record.owner == myself():
            stop(record)
            forget(children_dir, record)
