"""EAGLENEST_DEVICE names the job's own GPUs (issue #51, part 4): a job that holds GPU 1
runs its in-process stages on GPU 1, whatever it asks; one that holds none runs on the CPU,
and asking for ``cuda`` then fails the job instead of taking the worker's GPU 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eaglenest.workers.jobs.options import OptionError, parse_options
from eaglenest.workers.jobs.pipeline import Pipeline
from eaglenest.workers.jobs.placing import JobGpus


def pipeline(gpus: JobGpus, **env: str) -> Pipeline:
    none: Any = None
    return Pipeline(name="j", spec=none, options=parse_options(env), sources=none,
                    store=none, work=Path("/nonexistent"), control=none, gpus=gpus)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


@pytest.mark.usefixtures("cuda")
def test_cuda_is_the_jobs_own_gpu_not_the_workers_first() -> None:
    held = JobGpus([1], {"CUDA_VISIBLE_DEVICES": "1"}, 24.0)
    assert pipeline(held, EAGLENEST_DEVICE="cuda")._device() == "cuda:1"  # before: "cuda"
    assert pipeline(held)._device() == "cuda:1"
    assert pipeline(held, EAGLENEST_DEVICE="cuda")._device(ranks=True) == "cuda"  # own view
    assert pipeline(held, EAGLENEST_DEVICE="cpu")._device() == "cpu"


@pytest.mark.usefixtures("cuda")
def test_a_job_without_gpus_never_takes_one() -> None:
    assert pipeline(JobGpus())._device() == "cpu"  # before: "cuda", the worker's GPU 0
    with pytest.raises(OptionError, match="EAGLENEST_DEVICE=cuda, but the job holds no GPU"):
        pipeline(JobGpus(), EAGLENEST_DEVICE="cuda")._device()
