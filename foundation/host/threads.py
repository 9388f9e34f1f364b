"""Thread pools sized for a shared host: a model process never asks for more threads than
the CPUs it may use, divided among the EagleNest compute processes running beside it.

Contract:
- usable CPUs = the process's affinity (``os.sched_getaffinity``), capped by the cgroup CPU
  quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``, rounded down, at
  least 1);
- compute processes = model servers and training runs of EagleNest on this host, counted
  in a host-wide ledger (``ComputeLedger``): each registers its pid while it runs, with its
  start time and the process that registered it (its owner). An entry counts only while
  that very process runs, not as a zombie (an exited child its parent has not waited for
  holds no CPU or memory), and while its owner runs; any other entry is removed;
- threads = max(1, usable CPUs // (those already running + the ones being started));
- ``EAGLENEST_TORCH_THREADS`` (then ``OMP_NUM_THREADS``) set explicitly wins; a caller's
  value was checked at Create against the API host's CPUs and is clamped by the worker to
  its own usable CPUs before a model server starts (foundation/host/ceilings.py clamp_threads);
- a host runs at most ``compute_budget`` compute processes: a worker that would start more
  (``ComputeLedger.admit``) starts none and fails the endpoint transition or job with
  ``ComputeBudgetExceeded`` (checked when starting, not reserved: starts racing each other
  may pass it together by the processes they start);
- the chosen plan is logged by the process that applies it and reported by the benchmarks
  (``ThreadPlan.describe``).

Example: 2 CPUs, one endpoint serving, a second endpoint starts -> 2 // 2 = 1 thread for the
new one. Processes already running keep the threads they started with.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eaglenest.foundation.host import children

log = logging.getLogger("eaglenest.threads")

THREADS_ENV = "EAGLENEST_TORCH_THREADS"
LEDGER_ENV = "EAGLENEST_COMPUTE_REGISTRY"
#: set by whoever starts compute processes together: how many share the CPUs, each included
SHARING_ENV = "EAGLENEST_COMPUTE_SHARING"


def cgroup_cpus(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Whole CPUs of the cgroup quota (None: no quota)."""
    quota: float | None = None
    with contextlib.suppress(OSError, ValueError):
        raw = (root / "cpu.max").read_text().split()
        if raw and raw[0] != "max":
            quota = int(raw[0]) / int(raw[1])
    if quota is None:
        for sub in ("cpu", "cpu,cpuacct"):
            with contextlib.suppress(OSError, ValueError):
                q = int((root / sub / "cpu.cfs_quota_us").read_text())
                p = int((root / sub / "cpu.cfs_period_us").read_text())
                if q > 0 and p > 0:
                    quota = q / p
                    break
    return None if quota is None else max(1, int(quota))


def usable_cpus(affinity: set[int] | None = None, cgroup_root: Path = Path("/sys/fs/cgroup"),
                ) -> int:
    cpus = len(affinity if affinity is not None else os.sched_getaffinity(0))
    quota = cgroup_cpus(cgroup_root)
    return max(1, min(cpus, quota) if quota else cpus)


@dataclass(frozen=True)
class ThreadPlan:
    threads: int  # torch intra-op (OpenMP) threads
    cpus: int  # CPUs this process may use
    sharing: int  # EagleNest compute processes sharing them, this one included
    source: str  # "auto", or the variable that set it

    def describe(self) -> str:
        how = (f"{self.cpus} usable CPUs / {self.sharing} EagleNest compute processes"
               if self.source == "auto" else f"set by {self.source}")
        return f"torch threads {self.threads} ({how})"

    def to_dict(self) -> dict[str, int | str]:
        return asdict(self)


def _explicit(env: Mapping[str, str]) -> tuple[int, str] | None:
    for name in (THREADS_ENV, "OMP_NUM_THREADS"):
        raw = env.get(name)
        if raw:
            if not raw.isdigit() or int(raw) < 1:
                raise ValueError(f"{name}={raw!r} must be a whole number >= 1")
            return int(raw), name
    return None


def plan_threads(sharing: int = 1, env: Mapping[str, str] | None = None,
                 cpus: int | None = None) -> ThreadPlan:
    """Threads for one compute process among ``sharing`` (itself included)."""
    cpus = usable_cpus() if cpus is None else cpus
    sharing = max(1, sharing)
    explicit = _explicit(os.environ if env is None else env)
    if explicit:
        return ThreadPlan(explicit[0], cpus, sharing, explicit[1])
    return ThreadPlan(max(1, cpus // sharing), cpus, sharing, "auto")


def sharing_from_env(env: Mapping[str, str] | None = None) -> int:
    raw = (os.environ if env is None else env).get(SHARING_ENV, "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


def apply_torch(plan: ThreadPlan) -> None:
    """torch's pools: ``plan.threads`` intra-op threads, one inter-op thread (inference and
    our training run one op at a time); logged."""
    import torch

    torch.set_num_threads(plan.threads)
    with contextlib.suppress(RuntimeError):  # only before the first parallel work
        torch.set_num_interop_threads(1)
    log.info("%s", plan.describe())


class ComputeBudgetExceeded(RuntimeError):
    """Starting more compute processes would pass the host's budget; the message says so in
    the words of a ResourceLimitExceeded and names the setting."""


def compute_budget(setting: int, cpus: int | None = None) -> int:
    """The host's budget of compute processes: EAGLENEST_MAX_COMPUTE_PROCESSES, or for 0
    four per usable CPU and at least 16 (one account's default instance quota)."""
    if setting > 0:
        return setting
    return max(16, 4 * (usable_cpus() if cpus is None else cpus))


def _live(entry: dict[str, Any]) -> bool:
    """The entry's process runs, is no zombie, is the one registered (an entry without a
    start time was written by an earlier version) and its owner, if recorded, runs."""
    started = children.start_time(int(entry["pid"]))
    if started is None or entry.get("start") not in (None, started):
        return False
    owner = entry.get("owner")
    return not owner or children.Identity(**owner).alive()


class ComputeLedger:
    """Host-wide record of running EagleNest compute processes: one file per process."""

    def __init__(self, root: Path | None = None) -> None:
        default = Path(tempfile.gettempdir()) / f"eaglenest-compute-{os.getuid()}"
        self.root = root or Path(os.environ.get(LEDGER_ENV) or default)

    def running(self) -> int:
        """Entries of live processes (module docstring); the others are removed."""
        count = 0
        for entry in self.root.glob("*.json") if self.root.is_dir() else []:
            try:
                live = _live(json.loads(entry.read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # unreadable: not ours to judge
            if live:
                count += 1
            else:
                entry.unlink(missing_ok=True)
        return count

    def admit(self, count: int, budget: int) -> int:
        """The processes running, when `count` more fit in `budget` (0: no check);
        ComputeBudgetExceeded otherwise."""
        running = self.running()
        if budget > 0 and running + count > budget:
            raise ComputeBudgetExceeded(
                f"ResourceLimitExceeded: The host-wide limit 'compute processes' is {budget} "
                f"Processes, with current utilization of {running} Processes and a request "
                f"delta of {count} Processes (model servers and training processes on this "
                f"host). Ask the operator to raise EAGLENEST_MAX_COMPUTE_PROCESSES.")
        return running

    def add(self, pid: int, role: str, plan: ThreadPlan, key: str = "") -> Path:
        """Count process ``pid`` until it exits (``key`` tells apart two in one process)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"{pid}{'-' + key if key else ''}.json"
        started, owner = children.start_time(pid), children.myself()
        part = path.with_suffix(".part")  # written whole, then named: a reader sees all of it
        part.write_text(json.dumps({
            "pid": pid, "start": -1 if started is None else started, "role": role,
            **plan.to_dict(), "owner": asdict(owner) if owner else None}))
        part.replace(path)
        return path

    @contextlib.contextmanager
    def entry(self, role: str, plan: ThreadPlan, key: str = "") -> Iterator[None]:
        """This process counted while the block runs."""
        path = self.add(os.getpid(), role, plan, key)
        try:
            yield
        finally:
            path.unlink(missing_ok=True)
