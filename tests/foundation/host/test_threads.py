"""Thread sizing on a shared host (foundation/host/threads.py): usable CPUs from affinity and the
cgroup quota, one share per EagleNest compute process counted in the host's compute ledger,
explicit settings first; model servers start with their share (workers/model_servers/process.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from eaglenest.foundation.host import threads
from eaglenest.foundation.host.threads import ComputeLedger, ThreadPlan, plan_threads, usable_cpus
from eaglenest.workers.model_servers.process import VLLM, ServerSpec, thread_env


def _cgroup(tmp_path: Path, v2: str | None = None, v1: tuple[int, int] | None = None) -> Path:
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    if v2 is not None:
        (root / "cpu.max").write_text(v2 + "\n")
    if v1 is not None:
        (root / "cpu").mkdir()
        (root / "cpu" / "cpu.cfs_quota_us").write_text(f"{v1[0]}\n")
        (root / "cpu" / "cpu.cfs_period_us").write_text(f"{v1[1]}\n")
    return root


def test_usable_cpus_is_affinity_capped_by_the_cgroup_quota(tmp_path: Path) -> None:
    eight = set(range(8))
    assert usable_cpus(eight, _cgroup(tmp_path / "a", v2="max 100000")) == 8
    assert usable_cpus(eight, _cgroup(tmp_path / "b", v2="250000 100000")) == 2  # 2.5 -> 2
    assert usable_cpus(eight, _cgroup(tmp_path / "c", v2="50000 100000")) == 1  # at least 1
    assert usable_cpus({0, 1}, _cgroup(tmp_path / "d", v2="400000 100000")) == 2
    assert usable_cpus(eight, _cgroup(tmp_path / "e", v1=(300000, 100000))) == 3
    assert usable_cpus(eight, _cgroup(tmp_path / "f", v1=(-1, 100000))) == 8
    assert usable_cpus(eight, tmp_path / "none") == 8


def test_plan_divides_the_cpus_and_explicit_settings_win() -> None:
    assert plan_threads(3, env={}, cpus=8) == ThreadPlan(2, 8, 3, "auto")
    assert plan_threads(5, env={}, cpus=2).threads == 1  # never below one
    assert plan_threads(1, env={}, cpus=2).describe() == (
        "torch threads 2 (2 usable CPUs / 1 EagleNest compute processes)")
    got = plan_threads(2, env={"OMP_NUM_THREADS": "3"}, cpus=2)
    assert (got.threads, got.source) == (3, "OMP_NUM_THREADS")
    got = plan_threads(2, env={"OMP_NUM_THREADS": "3", "EAGLENEST_TORCH_THREADS": "1"}, cpus=2)
    assert got.describe() == "torch threads 1 (set by EAGLENEST_TORCH_THREADS)"
    with pytest.raises(ValueError) as exc:
        plan_threads(1, env={"EAGLENEST_TORCH_THREADS": "0"}, cpus=2)
    assert str(exc.value) == "EAGLENEST_TORCH_THREADS='0' must be a whole number >= 1"


def test_registry_counts_live_processes_only(tmp_path: Path) -> None:
    ledger = ComputeLedger(tmp_path / "ledger")
    assert ledger.running() == 0
    plan = ThreadPlan(1, 2, 1, "auto")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    ledger.add(gone.pid, "serving:embedded", plan)
    with ledger.entry("training", plan, key="job-a"):
        assert ledger.running() == 1  # the exited process does not count, and is forgotten
        assert not (ledger.root / f"{gone.pid}.json").exists()
        with ledger.entry("training", plan, key="job-b"):
            assert ledger.running() == 2
    assert ledger.running() == 0


def test_a_server_starts_with_its_share_and_vllm_with_its_own_cores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "usable_cpus", lambda: 4)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    for name in ("OMP_NUM_THREADS", "EAGLENEST_TORCH_THREADS", "VLLM_CPU_OMP_THREADS_BIND"):
        monkeypatch.delenv(name, raising=False)
    ledger = ComputeLedger(tmp_path / "ledger")
    spec = ServerSpec(model_dir=Path("/m"), served_name="m", port=1, backend=VLLM)
    env, plan = thread_env(spec, ledger)
    assert env == {"EAGLENEST_COMPUTE_SHARING": "1"} and plan.threads == 4  # alone: all cores
    ledger.add(os.getpid(), "serving:vllm", plan)  # one already running
    env, plan = thread_env(spec, ledger)
    assert plan.threads == 2
    assert env == {"EAGLENEST_COMPUTE_SHARING": "2", "VLLM_CPU_OMP_THREADS_BIND": "2,3"}
    # started together with another (the caller says 3 share): slot 1 of 3 -> core 1
    spec.extra_env = {"EAGLENEST_COMPUTE_SHARING": "3"}
    env, plan = thread_env(spec, ledger)
    assert plan.threads == 1 and env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    spec.extra_env = {"VLLM_CPU_OMP_THREADS_BIND": "0-3"}  # the container's own binding wins
    env, _ = thread_env(spec, ledger)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env
