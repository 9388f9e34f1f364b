"""CPU instance types on hosts with GPUs (workers/infra/placement.py): vLLM there is the
CUDA build, so a CPU type served by vLLM goes to a host without GPUs; the embedded engine
runs on the CPU anywhere. Declared inventories on SQLite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eaglenest.db import placement_repo as repo
from eaglenest.db.migrate import upgrade_head
from eaglenest.db.session import Database
from eaglenest.foundation.instance_types import lookup
from eaglenest.foundation.queue import TaskQueue
from eaglenest.foundation.settings import Settings
from eaglenest.workers.infra.placement import (
    RETRY_SECONDS,
    NoCapacity,
    Placer,
    capacity_reason,
)

CPU = lookup("ml.m5.xlarge")
GPU = lookup("ml.g5.2xlarge")
ARN = "arn:aws:sagemaker:us-east-1:123456789012:endpoint/e"


class Sent(TaskQueue):
    """Records what route() sends instead of publishing it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str, float]] = []

    def send(self, task: str, arn: str, queue: str, countdown: float = 0) -> bool:
        self.sent.append((task, arn, queue, countdown))
        return True


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    url = f"sqlite:///{tmp_path / 'placement.db'}"
    upgrade_head(url)
    d = Database(url)
    yield d
    d.dispose()


def placer(db: Database, tmp_path: Path, host: str, gpus: str, queues: str = "serve"
           ) -> Placer:
    settings = Settings(data_dir=tmp_path, gpus=gpus, host_name=host)
    p = Placer(settings, db, f"{host}:1", queues)
    p.register()
    return p


def held(db: Database) -> list[tuple[str, int]]:
    with db.session() as s:
        return [(h.host, h.gpu_index) for h in repo.holdings(s)]


def test_a_cpu_type_served_by_vllm_is_refused_on_a_host_with_gpus(
        db: Database, tmp_path: Path) -> None:
    gpu_host = placer(db, tmp_path, "gpu-host", "2x24GiB:A10G")
    with pytest.raises(NoCapacity) as exc:
        gpu_host.take(ARN, "v-0-0", CPU, backend="vllm")
    assert exc.value.instance_type == CPU
    assert exc.value.why == ("host gpu-host has GPUs and its vLLM is a CUDA build: a CPU "
                             "instance type needs a host without GPUs or "
                             "EAGLENEST_SERVING_BACKEND=embedded")
    assert "for ml.m5.xlarge (host gpu-host has GPUs" in capacity_reason(CPU.name, exc.value.why)
    assert held(db) == []


def test_the_embedded_engine_or_an_unknown_backend_runs_a_cpu_type_beside_gpus(
        db: Database, tmp_path: Path) -> None:
    gpu_host = placer(db, tmp_path, "gpu-host", "2x24GiB:A10G")
    assert gpu_host.take(ARN, "v-0-0", CPU, backend="embedded") == []
    assert gpu_host.take(ARN, "v-0-1", CPU) == []  # a job: its backend is chosen later
    assert gpu_host.visible([]) == {"CUDA_VISIBLE_DEVICES": ""}
    assert gpu_host.take(ARN, "v-0-2", GPU, backend="vllm") == [0]  # GPU types as before
    assert held(db) == [("gpu-host", 0)]


def test_vllm_serves_a_cpu_type_on_a_host_without_gpus(db: Database, tmp_path: Path) -> None:
    placer(db, tmp_path, "gpu-host", "2x24GiB:A10G")  # a GPU host in the cluster
    cpu_host = placer(db, tmp_path, "cpu-host", "none")
    assert cpu_host.take(ARN, "v-0-0", CPU, backend="vllm") == []
    assert cpu_host.visible([]) == {} and held(db) == []


def test_route_sends_a_refused_cpu_type_to_a_host_without_gpus_only(
        db: Database, tmp_path: Path) -> None:
    gpu_host = placer(db, tmp_path, "gpu-host", "2x24GiB:A10G")
    placer(db, tmp_path, "gpu-host-2", "1x24GiB:A10G")  # fits "0 GPUs" but has GPUs
    q = Sent()
    assert gpu_host.route(q, "create", ARN, "serve", CPU) == "serve"  # no such host yet
    assert q.sent == [("create", ARN, "serve", RETRY_SECONDS)]
    placer(db, tmp_path, "cpu-host", "none", queues="train")  # not a serve worker
    assert gpu_host.route(q, "create", ARN, "serve", CPU) == "serve"
    placer(db, tmp_path, "cpu-host-2", "none")
    assert gpu_host.route(q, "create", ARN, "serve", CPU) == "serve.cpu-host-2"
    assert q.sent[-1] == ("create", ARN, "serve.cpu-host-2", 0)
    # a GPU type still goes to a host with a free GPU that fits
    assert gpu_host.route(q, "create", ARN, "serve", GPU) == "serve.gpu-host-2"


def test_a_host_counts_as_having_gpus_when_any_of_its_queue_workers_has_one(
        db: Database, tmp_path: Path) -> None:
    placer(db, tmp_path, "mixed", "none")
    p = Placer(Settings(data_dir=tmp_path, gpus="1x24GiB:A10G", host_name="mixed"), db,
               "mixed:2", "serve")
    p.register()
    placer(db, tmp_path, "plain", "none")
    with db.session() as s:
        assert repo.hosts_that_fit(s, "serve", 0, 0.0, 60, without_gpus=True) == (
            ["plain"], ["plain"])
        assert repo.hosts_that_fit(s, "serve", 0, 0.0, 60) == (
            ["mixed", "plain"], ["mixed", "plain"])
