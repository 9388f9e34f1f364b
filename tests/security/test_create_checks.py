"""Create checks a job's and a container's options with the worker's own functions (issue
#51, part 5): a value the worker would refuse is refused by CreateOptimizationJob or
CreateModel, in the worker's words, and nothing is stored. The API in this process."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglenest.foundation import job_options
from eaglenest.foundation.host.ceilings import LimitError, clamp_threads
from eaglenest.workers.jobs.options import OptionError, parse_options
from eaglenest.workers.serving.deploy import DeployError, VariantPlan, _spec
from tests.security.asgi_api import InProcessApi
from tests.security.test_account_quotas import job, make_api, model, ok, refused

#: job options the worker refused while CreateOptimizationJob accepted them
JOB_VALUES = [
    ("EAGLENEST_NUM_SPECULATIVE_TOKENS", "100000"),
    ("EAGLENEST_DRAFT_VOCAB_SIZE", "1000001"),
    ("EAGLENEST_MAX_TRAIN_MINUTES", "nan"),
    ("EAGLENEST_MAX_TRAIN_MINUTES", "-1"),
    ("EAGLENEST_MAX_TRAIN_MINUTES", "inf"),
    ("EAGLENEST_LEARNING_RATE", "nan"),
    ("EAGLENEST_BENCH_CONCURRENCY", "1,2,0"),
    ("EAGLENEST_DEVICE", "cuda:0"),
    ("EAGLENEST_CAPTURE_BACKEND", "tensorrt"),
    ("EAGLENEST_DTYPE", "int3"),
]
#: container options a model server refused while CreateModel accepted them
CONTAINER_VALUES = [
    ("EAGLENEST_NUM_SPECULATIVE_TOKENS", "100000"),
    ("EAGLENEST_SERVING_BACKEND", "tgi"),
    ("EAGLENEST_ADAPTIVE", "yes"),
    ("EAGLENEST_SPLIT_SERVING", "2"),
    ("EAGLENEST_EXPECTED_CONCURRENCY", "0"),
    ("OPTION_GPU_MEMORY_UTILIZATION", "2"),
    ("OPTION_TENSOR_PARALLEL_DEGREE", "two"),
    ("MAX_INPUT_LENGTH", "4096"),  # not below the CPU's default length, 2048
]


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> InProcessApi:
    with pytest.MonkeyPatch.context() as mp:
        return make_api(tmp_path_factory.mktemp("create-checks"), mp)


@pytest.mark.parametrize(("name", "value"), JOB_VALUES)
def test_job_options_the_worker_refuses_are_refused_at_create(api: InProcessApi, name: str,
                                                              value: str) -> None:
    with pytest.raises(OptionError) as worker:
        parse_options({name: value})
    job_name = f"bad-{name.lower().replace('_', '-')}-{abs(hash(value)) % 1000}"
    message = refused(api, "CreateOptimizationJob", job(job_name, **{name: value}),
                      code="ValidationException")
    assert message == (f"OptimizationEnvironment: {worker.value} (EagleNest's limits: "
                       f"docs/configuration.md).")
    r = api.call("DescribeOptimizationJob", {"OptimizationJobName": job_name},
                 "AKIAALICE00000000001", "alice-secret")
    assert r.json()["__type"] == "ResourceNotFound"


def test_thread_lists_are_refused_for_jobs_and_models(api: InProcessApi) -> None:
    """OMP_NUM_THREADS="2,512" read as 2 passed Create; libgomp runs 512 threads at the
    second nesting level, and the worker's own reader refuses it."""
    with pytest.raises(LimitError) as worker:
        clamp_threads({"OMP_NUM_THREADS": "2,512"}, 2)
    message = refused(api, "CreateOptimizationJob", job("threads", OMP_NUM_THREADS="2,512"),
                      code="ValidationException")
    assert str(worker.value) in message
    message = refused(api, "CreateModel", model("threads", {"OMP_NUM_THREADS": "2,512"}),
                      code="ValidationException")
    assert message == f"Environment variable {worker.value} (in PrimaryContainer.Environment)."


def test_cuda_needs_a_gpu_type() -> None:
    """EAGLENEST_DEVICE=cuda names the job's own GPUs: a type without any is refused (the
    request shape's enum holds no CPU type, so this is the function Create calls)."""
    with pytest.raises(job_options.OptionError, match="EAGLENEST_DEVICE=cuda needs a GPU "
                                                      "instance type: ml.m5.xlarge has none"):
        job_options.check_create({"EAGLENEST_DEVICE": "cuda"}, "OptimizationEnvironment", 2,
                                 0, "ml.m5.xlarge")
    job_options.check_create({"EAGLENEST_DEVICE": "cuda"}, "OptimizationEnvironment", 2, 1,
                             "ml.g5.xlarge")


def plan(**env: str) -> VariantPlan:
    return VariantPlan("AllTraffic", "m", 1.0, 1, 60, "s3://models/m/", None,
                       {"EAGLENEST_SERVING_BACKEND": "embedded", **env})


@pytest.mark.parametrize(("name", "value"), CONTAINER_VALUES)
def test_container_options_the_worker_refuses_are_refused_by_create_model(
        api: InProcessApi, name: str, value: str) -> None:
    env = {"EAGLENEST_SERVING_BACKEND": "embedded", name: value}
    with pytest.raises(DeployError) as worker:
        _spec(plan(**env), Path("/m"), None, "ep")
    model_name = f"bad-{name.lower().replace('_', '-')}"
    message = refused(api, "CreateModel", model(model_name, env), code="ValidationException")
    assert message == f"PrimaryContainer.Environment: {worker.value}"


def test_good_options_still_pass(api: InProcessApi) -> None:
    ok(api, "CreateModel", model("good", {
        "EAGLENEST_SERVING_BACKEND": "embedded", "EAGLENEST_NUM_SPECULATIVE_TOKENS": "64",
        "EAGLENEST_ADAPTIVE": "1", "OMP_NUM_THREADS": "1", "MAX_INPUT_LENGTH": "1024"}))
    ok(api, "CreateOptimizationJob", job("good", EAGLENEST_NUM_SPECULATIVE_TOKENS="64",
                                         EAGLENEST_MAX_TRAIN_MINUTES="0.5",
                                         EAGLENEST_DRAFT_VOCAB_SIZE="1000000"))


def test_the_control_planes_names_are_the_workers() -> None:
    """foundation/server_options.py names what models/ and workers/ define (the control
    plane imports neither)."""
    from eaglenest.foundation import server_options
    from eaglenest.models.decode.modes import SPECULATIVE_MODES, DecodeMode
    from eaglenest.workers.model_servers.process import EMBEDDED, VLLM

    assert DecodeMode.CHAIN.value == server_options.DEFAULT_MODE
    assert server_options.DEFAULT_MODE in SPECULATIVE_MODES
    assert server_options.SERVING_BACKENDS == (VLLM, EMBEDDED)
