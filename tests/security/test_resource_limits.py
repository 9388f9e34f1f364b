"""Options that multiply what a request costs have ceilings, and quotas count what runs
(issue #35, finding 4): through boto3 against a real `eaglenest up`.

- CreateModel refuses thread counts over the API host's CPUs and max lengths over 131072;
  CreateOptimizationJob refuses EAGLENEST_BATCH_SIZE, EAGLENEST_MAX_LENGTH,
  EAGLENEST_MAX_STEPS over their ceilings and EAGLENEST_TRAIN_PROCESSES over the GPUs of
  its DeploymentInstanceType: ValidationException naming the option and the limit, nothing
  created; the ceiling itself is accepted (foundation/host/ceilings.py).
- A job holds one instance per GPU of its type against EAGLENEST_MAX_INSTANCES; a host
  starts no more model servers than EAGLENEST_MAX_COMPUTE_PROCESSES (the endpoint fails).
- Data Capture past the account's spool quota stops capturing (the requests are served);
  a job whose outputs would pass the account's stored-bytes quota fails with a
  ResourceLimitExceeded reason and leaves nothing in the store (foundation/store/disk_usage.py).

(tests/security/test_limits.py is about prompt lengths, the model server's limits.)"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.security.conftest import ROLE, SERVING_ENV, container, error_of
from tests.support.jobs import job as tiny_job
from tests.support.jobs import upload, wait_status
from tests.support.stack import ACCOUNT, Stack

CPUS = len(os.sched_getaffinity(0))  # the API runs on this host: its CPUs are the ceiling
THREADS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "EAGLENEST_TORCH_THREADS")
LENGTHS = ("EAGLENEST_MAX_MODEL_LEN", "OPTION_MAX_MODEL_LEN", "MAX_TOTAL_TOKENS",
           "MAX_INPUT_LENGTH")


@pytest.fixture(scope="module")
def api_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """API and broker only (jobs stay STARTING and endpoints Creating, holding their
    quota), room for 5 instances."""
    s = Stack(tmp_path_factory.mktemp("ceilings"), extra_env={
        "EAGLENEST_WORKER_QUEUES": "", "EAGLENEST_MAX_INSTANCES": "5"}).start()
    yield s
    s.stop()


def refused(call: Any, code: str = "ValidationException", **kw: Any) -> str:
    with pytest.raises(ClientError) as exc:
        call(**kw)
    got, message = error_of(exc)
    assert got == code, message
    return message


def model(name: str, **env: str) -> dict[str, Any]:
    return {"ModelName": name, "ExecutionRoleArn": ROLE,
            "PrimaryContainer": container({**SERVING_ENV, **env})}


def job_request(name: str, itype: str = "ml.g5.2xlarge", **env: str) -> dict[str, Any]:
    return {"OptimizationJobName": name, "RoleArn": ROLE,
            "ModelSource": {"S3": {"S3Uri": "s3://models/tiny/"}},
            "DeploymentInstanceType": itype, "OptimizationEnvironment": env,
            "OptimizationConfigs": [{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
            "OutputConfig": {"S3OutputLocation": "s3://output/limits/"},
            "StoppingCondition": {"MaxRuntimeInSeconds": 60}}


def no_model(sm: Any, name: str) -> None:
    assert refused(sm.describe_model, ModelName=name).startswith("Could not find model")


def no_job(sm: Any, name: str) -> None:
    refused(sm.describe_optimization_job, "ResourceNotFound", OptimizationJobName=name)


def test_thread_counts_over_the_cpus_are_refused(api_only: Stack) -> None:
    sm = api_only.client()
    for name in THREADS:
        for value in (str(CPUS + 1), "1000000000", f"{CPUS + 1},1"):  # strtoul reads 'N,1'
            model_name = f"threads-{name.lower().replace('_', '-')}"
            message = refused(sm.create_model, **model(model_name, **{name: value}))
            assert message == (
                f"Environment variable {name}={value} is over its limit: at most {CPUS}, the "
                f"usable CPUs of the API host (more threads than CPUs only wait for each "
                f"other) (in PrimaryContainer.Environment).")
            no_model(sm, model_name)
        sm.create_model(**model(f"ok-{name.lower().replace('_', '-')}", **{name: str(CPUS)}))
    # a job's OptimizationEnvironment too
    message = refused(sm.create_optimization_job,
                      **job_request("threads-job", OMP_NUM_THREADS=str(CPUS + 1)))
    assert f"OMP_NUM_THREADS={CPUS + 1} is over its limit: at most {CPUS}" in message
    no_job(sm, "threads-job")


def test_max_lengths_over_131072_are_refused(api_only: Stack) -> None:
    sm = api_only.client()
    for name in LENGTHS:
        base = {} if name != "MAX_INPUT_LENGTH" else {"EAGLENEST_MAX_MODEL_LEN": "131072"}
        model_name = f"len-{name.lower().replace('_', '-')}"
        message = refused(sm.create_model, **model(model_name, **{**base, name: "131073"}))
        assert message == (f"Environment variable {name}=131073 is over its limit: at most "
                           f"131072 tokens (EagleNest's longest max model length) (in "
                           f"PrimaryContainer.Environment).")
        no_model(sm, model_name)
        limit = "131071" if name == "MAX_INPUT_LENGTH" else "131072"
        sm.create_model(**model(f"ok-{model_name}", **{**base, name: limit}))


@pytest.mark.parametrize(("name", "over", "limit", "itype"), [
    ("EAGLENEST_BATCH_SIZE", "257", "256", "ml.g5.2xlarge"),
    ("EAGLENEST_BATCH_SIZE", "4096", "256", "ml.g5.2xlarge"),
    ("EAGLENEST_MAX_LENGTH", "32769", "32768", "ml.g5.2xlarge"),
    ("EAGLENEST_MAX_LENGTH", "1000000", "32768", "ml.g5.2xlarge"),
    ("EAGLENEST_MAX_STEPS", "1000001", "1000000", "ml.g5.2xlarge"),
    ("EAGLENEST_MAX_STEPS", "10000000", "1000000", "ml.g5.2xlarge"),
])
def test_job_options_over_their_ceilings_are_refused(api_only: Stack, name: str, over: str,
                                                     limit: str, itype: str) -> None:
    sm = api_only.client()
    job_name = f"over-{name.lower().replace('_', '-')}-{over}"
    message = refused(sm.create_optimization_job, **job_request(job_name, itype, **{name: over}))
    lo = "16" if name == "EAGLENEST_MAX_LENGTH" else "1"
    assert message == (f"OptimizationEnvironment: {name}={over} must be between {lo} and "
                       f"{limit} (EagleNest's limits: docs/configuration.md).")
    no_job(sm, job_name)
    ok = f"at-{name.lower().replace('_', '-')}-{over}"
    sm.create_optimization_job(**job_request(ok, itype, **{name: limit}))
    sm.stop_optimization_job(OptimizationJobName=ok)  # no worker: STOPPED at once


def test_training_processes_over_the_gpus_are_refused(api_only: Stack) -> None:
    sm = api_only.client()
    for itype, gpus, over in (("ml.g5.2xlarge", 1, "2"), ("ml.g5.12xlarge", 4, "5"),
                              ("ml.g5.12xlarge", 4, "64")):
        name = f"ranks-{gpus}-{over}"
        message = refused(sm.create_optimization_job,
                          **job_request(name, itype, EAGLENEST_TRAIN_PROCESSES=over))
        assert message == (f"OptimizationEnvironment: EAGLENEST_TRAIN_PROCESSES={over} is more "
                           f"than the {gpus} GPU(s) of {itype} (EagleNest's limits: "
                           f"docs/configuration.md).")
        no_job(sm, name)
    sm.create_optimization_job(**job_request("ranks-ok", "ml.g5.12xlarge",
                                             EAGLENEST_TRAIN_PROCESSES="4"))
    sm.stop_optimization_job(OptimizationJobName="ranks-ok")


def test_a_job_holds_its_gpus_as_instances(api_only: Stack) -> None:
    """EAGLENEST_MAX_INSTANCES=5: an endpoint of 1 instance and a job of ml.g5.12xlarge
    (4 GPUs) use all 5; one more job or endpoint is refused, and created again once the
    job stopped."""
    sm = api_only.client()
    sm.create_model(**model("quota-m"))
    sm.create_endpoint_config(EndpointConfigName="quota-c", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "quota-m", "InstanceType": "ml.g5.2xlarge",
        "InitialInstanceCount": 1}])
    sm.create_endpoint(EndpointName="quota-e1", EndpointConfigName="quota-c")
    sm.create_optimization_job(**job_request("big", "ml.g5.12xlarge"))
    for call, kw, delta in (
            (sm.create_optimization_job, job_request("small"), 1),
            (sm.create_optimization_job, job_request("ranks", "ml.g5.12xlarge",
                                                     EAGLENEST_TRAIN_PROCESSES="2"), 4),
            (sm.create_endpoint, {"EndpointName": "quota-e2", "EndpointConfigName": "quota-c"},
             1)):
        message = refused(call, "ResourceLimitExceeded", **kw)
        assert message.startswith(
            f"The account-level service limit 'instances across all endpoints' is 5 "
            f"Instances, with current utilization of 5 Instances and a request delta of "
            f"{delta} Instances.")
        assert "EAGLENEST_MAX_INSTANCES" in message and "optimization job" in message
    no_job(sm, "small")
    assert [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]] == ["quota-e1"]
    sm.stop_optimization_job(OptimizationJobName="big")
    sm.create_optimization_job(**job_request("small"))


# -- disk quotas ---------------------------------------------------------------------------

SPOOL_QUOTA = 2048


@pytest.fixture(scope="module")
def capturing(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[Stack]:
    """A serve worker; each account may spool 2 KiB of Data Capture (rolled after an hour:
    what is captured stays in the spool during the test); the host runs at most 2 compute
    processes, counted in a ledger of the stack's own (not the other stacks' here)."""
    data_dir = tmp_path_factory.mktemp("spool-quota")
    s = Stack(data_dir, extra_env={
        "EAGLENEST_WORKER_QUEUES": "serve", "EAGLENEST_MAX_COMPUTE_PROCESSES": "2",
        "EAGLENEST_COMPUTE_REGISTRY": str(data_dir / "compute"),
        "EAGLENEST_MAX_CAPTURE_SPOOL_BYTES": str(SPOOL_QUOTA),
        "EAGLENEST_CAPTURE_FLUSH_SECONDS": "3600"}).start()
    upload(s, tiny_llama_dir, "s3://models/tiny/")
    yield s
    s.stop()


def spooled(stack: Stack) -> list[bytes]:
    """The records in the stack's capture spool files."""
    return [line for f in (stack.data_dir / "capture-spool").glob("*/*.jsonl")
            for line in f.read_bytes().splitlines()]


def test_capture_past_the_spool_quota_stops_capturing(capturing: Stack) -> None:
    sm, rt = capturing.client(), capturing.client("sagemaker-runtime")
    sm.create_model(**model("cap-m"))
    sm.create_endpoint_config(EndpointConfigName="cap-c", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "cap-m", "InstanceType": "ml.g5.2xlarge",
        "InitialInstanceCount": 1, "ContainerStartupHealthCheckTimeoutInSeconds": 120}],
        DataCaptureConfig={"InitialSamplingPercentage": 100,
                           "DestinationS3Uri": "s3://captured/limits/",
                           "CaptureOptions": [{"CaptureMode": "Input"},
                                              {"CaptureMode": "Output"}]})
    sm.create_endpoint(EndpointName="cap-e", EndpointConfigName="cap-c")
    sm.get_waiter("endpoint_in_service").wait(
        EndpointName="cap-e", WaiterConfig={"Delay": 1, "MaxAttempts": 240})
    sent = 20
    for i in range(sent):  # every request is served, captured or not
        r = rt.invoke_endpoint(EndpointName="cap-e", ContentType="application/json",
                               Body=json.dumps({"prompt": f"hello {i}", "max_tokens": 2}))
        assert r["ResponseMetadata"]["HTTPStatusCode"] == 200
    records = spooled(capturing)
    assert 1 <= len(records) < sent, len(records)
    assert sum(len(r) + 1 for r in records) <= SPOOL_QUOTA
    log = capturing.log()
    assert f"Data Capture of account {ACCOUNT} stopped: ResourceLimitExceeded: The " \
           f"account-level service limit 'Data Capture spool bytes' is {SPOOL_QUOTA} " \
           f"Bytes" in log, log[-3000:]
    assert "EAGLENEST_MAX_CAPTURE_SPOOL_BYTES" in log


def test_a_host_starts_no_more_compute_processes_than_its_budget(capturing: Stack) -> None:
    """EAGLENEST_MAX_COMPUTE_PROCESSES=2: an endpoint of 3 instances is not started; it
    fails with the reason, and no model server of it runs."""
    from eaglenest.foundation.host.threads import ComputeLedger

    ledger = ComputeLedger(capturing.data_dir / "compute")
    sm, running = capturing.client(), ledger.running()
    sm.create_model(**model("budget-m"))
    sm.create_endpoint_config(EndpointConfigName="budget-c", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "budget-m", "InstanceType": "ml.g5.2xlarge",
        "InitialInstanceCount": 3, "ContainerStartupHealthCheckTimeoutInSeconds": 120}])
    sm.create_endpoint(EndpointName="budget-e", EndpointConfigName="budget-c")
    deadline = time.monotonic() + 240
    while (d := sm.describe_endpoint(EndpointName="budget-e"))["EndpointStatus"] == "Creating":
        assert time.monotonic() < deadline, d
        time.sleep(0.5)
    assert d["EndpointStatus"] == "Failed", d
    assert d["FailureReason"].startswith(
        "Variant AllTraffic: ResourceLimitExceeded: The host-wide limit 'compute processes' "
        "is 2 Processes, with current utilization of "), d["FailureReason"]
    assert "a request delta of 3 Processes" in d["FailureReason"]
    assert "EAGLENEST_MAX_COMPUTE_PROCESSES" in d["FailureReason"]
    assert ledger.running() == running  # none of its servers started


@pytest.fixture(scope="module")
def storing(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[Stack]:
    """A train worker; the account may store its model and 1 KiB more: no job output fits."""
    model_bytes = sum(p.stat().st_size for p in tiny_llama_dir.rglob("*") if p.is_file())
    s = Stack(tmp_path_factory.mktemp("stored-quota"), extra_env={
        "EAGLENEST_WORKER_QUEUES": "train",
        "EAGLENEST_MAX_STORED_BYTES": str(model_bytes + 1024)}).start()
    upload(s, tiny_llama_dir, "s3://models/tiny-llama/")
    stored = s.data_dir / "s3" / "models"
    assert sum(p.stat().st_size for p in stored.rglob("*") if p.is_file()) == model_bytes
    yield s
    s.stop()


def test_job_outputs_past_the_stored_quota_fail_the_job(storing: Stack) -> None:
    sm = storing.client()
    sm.create_optimization_job(OptimizationJobName="too-big", **tiny_job(
        "s3://models/tiny-llama/", output_model="too-big-model", EAGLENEST_BENCHMARK="0",
        EAGLENEST_MAX_STEPS="2", EAGLENEST_CHECKPOINT_EVERY="1"))
    d = wait_status(sm, "too-big", {"COMPLETED", "FAILED", "STOPPED"}, timeout=600)
    assert d["OptimizationJobStatus"] == "FAILED", d
    reason = d["FailureReason"]
    assert reason.startswith("ResourceLimitExceeded: The account-level service limit 'bytes "
                             "stored' is "), reason
    assert "EAGLENEST_MAX_STORED_BYTES" in reason
    # nothing of the job in the store: no output, no checkpoint, no training log
    out = storing.data_dir / "s3" / "output" / "jobs" / "too-big"
    left = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert left == []
    no_model(sm, "too-big-model")
