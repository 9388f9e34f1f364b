"""Ceilings and disk quotas as units (foundation/host/ceilings.py, foundation/host/threads.py's compute
budget, foundation/store/disk_usage.py, api/runtime/disk_quota.py); the end-to-end checks through
boto3 are tests/security/test_resource_limits.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eaglenest.api.runtime import disk_quota
from eaglenest.foundation.host import ceilings
from eaglenest.foundation.host.threads import (
    ComputeBudgetExceeded,
    ComputeLedger,
    ThreadPlan,
    compute_budget,
)
from eaglenest.foundation.job_options import check_create
from eaglenest.foundation.store.buckets import AccountStore
from eaglenest.foundation.store.disk_usage import (
    StoredBytesExceeded,
    account_bytes,
    check_stored,
    prefix_bytes,
)
from eaglenest.foundation.store.storage import LocalStore, parse_uri
from eaglenest.workers.jobs.options import OptionError, parse_options
from eaglenest.workers.model_servers.process import ServerSpec, thread_env


@pytest.mark.parametrize(("raw", "over"), [
    ("3", True), ("2", False), ("1000000000", True), ("3,1", True),  # libgomp reads 3
    (" +3", True), ("\u0663", True), ("9" * 5000, True), ("abc", None), ("0", None),
    ("2,512", None), ("1,1", None), ("", False),  # None: no reader takes it alike
])
def test_thread_counts_are_read_as_any_reader_would(raw: str, over: bool | None) -> None:
    """Over the CPUs by any reading: refused at Create, clamped by the worker. Not one
    whole number (a list sets OpenMP's nested pools: "2,512" is 512 threads at the second
    level): refused at Create and by the worker alike (issue #51, part 5)."""
    env = {"OMP_NUM_THREADS": raw}
    if over:
        with pytest.raises(ceilings.LimitError, match="OMP_NUM_THREADS=.* at most 2"):
            ceilings.check_model_environment(env, "PrimaryContainer.Environment", cpus=2)
    elif over is None:
        with pytest.raises(ceilings.LimitError, match="must be a whole number >= 1"):
            ceilings.check_model_environment(env, "PrimaryContainer.Environment", cpus=2)
        with pytest.raises(ceilings.LimitError, match="must be a whole number >= 1"):
            ceilings.clamp_threads(env, 2)
    else:
        ceilings.check_model_environment(env, "PrimaryContainer.Environment", cpus=2)
        assert ceilings.clamp_threads(env, 2) == {}
    if over and raw.isascii() and raw.isdigit():
        assert ceilings.clamp_threads(env, 2) == {"OMP_NUM_THREADS": "2"}


def test_job_ranges_are_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """What CreateOptimizationJob refuses, the worker's parser refuses in the same words."""
    for name, (lo, hi) in ceilings.JOB_RANGES.items():
        parse_options({name: str(hi)})
        with pytest.raises(OptionError) as worker:
            parse_options({name: str(hi + 1)})
        with pytest.raises(OptionError) as create:
            check_create({name: str(hi + 1)}, "OptimizationEnvironment", cpus=2, gpus=64,
                         instance_type="ml.x")
        assert str(worker.value) == f"{name}={hi + 1} must be between {lo} and {hi}"
        assert str(create.value).startswith(f"OptimizationEnvironment: {worker.value} (")
    with pytest.raises(OptionError, match="is more than the 4 GPU"):
        check_create({"EAGLENEST_TRAIN_PROCESSES": "5"}, "E", 2, 4, "ml.g5.12xlarge")


def test_a_job_holds_its_gpus_or_its_ranks() -> None:
    assert ceilings.job_instances({}, 4) == 4
    assert ceilings.job_instances({"EAGLENEST_TRAIN_PROCESSES": "2"}, 4) == 4
    assert ceilings.job_instances({"EAGLENEST_TRAIN_PROCESSES": "3"}, 0) == 3
    assert ceilings.job_instances({"EAGLENEST_TRAIN_PROCESSES": "x"}, 0) == 1


def test_the_worker_clamps_a_containers_threads_to_its_cpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eaglenest.foundation.host import threads

    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    for name in ("OMP_NUM_THREADS", "EAGLENEST_TORCH_THREADS"):
        monkeypatch.delenv(name, raising=False)
    spec = ServerSpec(model_dir=Path("/m"), served_name="m", port=1,
                      extra_env={"OMP_NUM_THREADS": "512", "MKL_NUM_THREADS": "8"})
    env, plan = thread_env(spec, ComputeLedger(tmp_path / "ledger"))
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"
    assert (plan.threads, plan.source) == (2, "OMP_NUM_THREADS")


def test_the_compute_budget(tmp_path: Path) -> None:
    assert compute_budget(0, cpus=2) == 16 and compute_budget(0, cpus=16) == 64
    assert compute_budget(5, cpus=16) == 5
    ledger = ComputeLedger(tmp_path / "ledger")
    plan = ThreadPlan(1, 2, 1, "auto")
    with ledger.entry("training", plan, key="a"), ledger.entry("training", plan, key="b"):
        assert ledger.admit(1, 3) == 2
        with pytest.raises(ComputeBudgetExceeded) as exc:
            ledger.admit(2, 3)
        assert str(exc.value).startswith(
            "ResourceLimitExceeded: The host-wide limit 'compute processes' is 3 Processes, "
            "with current utilization of 2 Processes and a request delta of 2 Processes")
        assert "EAGLENEST_MAX_COMPUTE_PROCESSES" in str(exc.value)
        assert ledger.admit(100, 0) == 2  # 0: not checked


def _store(tmp_path: Path) -> LocalStore:
    store = LocalStore(tmp_path / "s3", default_account="111111111111")
    for bucket, account in (("a-one", "111111111111"), ("a-two", "111111111111"),
                            ("bob", "222222222222")):
        store.claim(bucket, account)
    store.put_bytes(parse_uri("s3://a-one/x"), b"1" * 100)
    store.put_bytes(parse_uri("s3://a-two/out/job/y"), b"2" * 50)
    store.put_bytes(parse_uri("s3://bob/z"), b"3" * 1000)
    return store


def test_an_accounts_bytes_are_its_buckets(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert account_bytes(store, "111111111111") == 150
    assert account_bytes(AccountStore(store, "222222222222"), "222222222222") == 1000
    assert prefix_bytes(store, parse_uri("s3://a-two/out/job/")) == 50
    view = AccountStore(store, "111111111111")
    check_stored(view, 200, 50, parse_uri("s3://a-two/other/"))
    check_stored(view, 200, 100, parse_uri("s3://a-two/out/job/"))  # the 50 are replaced
    with pytest.raises(StoredBytesExceeded) as exc:
        check_stored(view, 200, 51, parse_uri("s3://a-two/other/"))
    assert str(exc.value).startswith(
        "ResourceLimitExceeded: The account-level service limit 'bytes stored' is 200 Bytes, "
        "with current utilization of 150 Bytes and a request delta of 51 Bytes")


def test_capture_admits_records_within_the_accounts_spool(tmp_path: Path) -> None:
    spool = tmp_path / "spool" / f"{os.getpid()}-1"
    spool.mkdir(parents=True)
    (spool / "f.json").write_text(json.dumps({"account": "111111111111"}))
    (spool / "f.jsonl").write_bytes(b"x" * 900)
    quota = disk_quota.DiskQuota(_store(tmp_path), tmp_path / "spool",
                                 disk_quota.Limits(spool=1000, stored=0))
    assert quota.admit("111111111111", 100)
    assert not quota.admit("111111111111", 1)  # 1000 spooled
    assert quota.admit("222222222222", 1000)  # another account's room
