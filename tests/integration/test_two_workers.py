"""The multi-host layout on one machine: the API and two separate Celery worker processes,
one consuming only queue `train` (prefork, one task per process, as docker compose's
worker-train) and one only `serve` (threads, as worker-serve), on real Postgres and a real
Redis broker. At the same time an optimization job trains a head on the tiny Llama target
and an endpoint serves that target with the embedded backend; each worker's JSON log
(EAGLENEST_LOG_FORMAT=json) shows which worker ran which task."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from eaglenest.foundation.host import children
from tests.support.jobs import wait_status
from tests.support.stack import ACCOUNT, Stack
from tests.support.workers import Worker, start_worker, upload

ROOT = Path(__file__).resolve().parents[2]
ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"
ENV = {"EAGLENEST_SERVING_BACKEND": "embedded", "EAGLENEST_NUM_SPECULATIVE_TOKENS": "3",
       "EAGLENEST_MAX_MODEL_LEN": "512"}
HOST = socket.gethostname()  # Celery's %h
JOB = "two-workers-job"
ENDPOINT = "two-workers-ep"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, postgres_server, redis_server, tiny_llama_dir
            ) -> Iterator[tuple[Stack, dict[str, Worker]]]:
    database = postgres_server.create_database("two_workers")
    broker = redis_server.url.rsplit("/", 1)[0] + "/7"  # a db of its own: no stray tasks
    stack = Stack(tmp_path_factory.mktemp("two-workers"), extra_env={
        "EAGLENEST_DATABASE_URL": database, "EAGLENEST_BROKER_URL": broker,
        "EAGLENEST_WORKER_QUEUES": "",  # `up` runs the API only; the workers are ours
        "EAGLENEST_LOG_FORMAT": "json"})
    stack.start()
    workers: dict[str, Worker] = {}
    try:
        workers["train"] = start_worker(stack, "train", "--pool", "prefork", "--concurrency", "1")
        workers["serve"] = start_worker(stack, "serve", "--concurrency", "4")
        upload(stack, tiny_llama_dir, "s3://models/tiny/")
        for w in workers.values():
            w.wait_ready()
        yield stack, workers
    finally:
        for w in workers.values():  # both at once: warm shutdowns take a few seconds
            w.stop()  # the serve worker stops its serving processes on the way out
        for w in workers.values():
            w.wait()
        stack.stop()


def test_train_and_serve_workers_split_the_work(cluster):
    stack, workers = cluster
    sm, rt = stack.client(), stack.client("sagemaker-runtime")
    sm.create_model(ModelName="tiny", ExecutionRoleArn=ROLE, PrimaryContainer={
        "Image": "eaglenest", "Environment": ENV, "ModelDataSource": {"S3DataSource": {
            "S3Uri": "s3://models/tiny/", "S3DataType": "S3Prefix",
            "CompressionType": "None"}}})
    sm.create_optimization_job(
        OptimizationJobName=JOB, RoleArn=ROLE,
        ModelSource={"SageMakerModel": {"ModelName": "tiny"}},
        DeploymentInstanceType="ml.g5.2xlarge",
        OptimizationEnvironment={
            "EAGLENEST_MAX_STEPS": "3", "EAGLENEST_MAX_LENGTH": "128",
            "EAGLENEST_REGENERATE": "0",
            "EAGLENEST_DATASET": "gsm8k_training.jsonl", "EAGLENEST_HOLDOUT": "2",
            "EAGLENEST_DRAFT_VOCAB_SIZE": "64", "EAGLENEST_BENCHMARK": "0",
            "EAGLENEST_CHECKPOINT_EVERY": "100", "EAGLENEST_DEVICE": "cpu"},
        OptimizationConfigs=[{"ModelSpeculativeDecodingConfig": {"Technique": "EAGLE"}}],
        OutputConfig={"S3OutputLocation": "s3://output/jobs/",
                      "SageMakerModel": {"ModelName": "tiny-eagle"}},
        StoppingCondition={"MaxRuntimeInSeconds": 600})
    sm.create_endpoint_config(EndpointConfigName="tiny-cfg", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "tiny", "InstanceType": "ml.g5.2xlarge",
        "InitialInstanceCount": 1, "ContainerStartupHealthCheckTimeoutInSeconds": 120}])
    sm.create_endpoint(EndpointName=ENDPOINT, EndpointConfigName="tiny-cfg")

    # both run at once, each on its own worker
    sm.get_waiter("endpoint_in_service").wait(
        EndpointName=ENDPOINT, WaiterConfig={"Delay": 1, "MaxAttempts": 150})
    assert sm.describe_endpoint(EndpointName=ENDPOINT)["EndpointStatus"] == "InService"
    r = rt.invoke_endpoint(EndpointName=ENDPOINT, ContentType="application/json", Body=json.dumps(
        {"inputs": "Natalia sold 48 clips", "parameters": {"max_new_tokens": 4}}))
    assert isinstance(json.loads(r["Body"].read())["generated_text"], str)
    d = wait_status(sm, JOB, {"COMPLETED", "FAILED", "STOPPED"}, timeout=240)
    assert d["OptimizationJobStatus"] == "COMPLETED", (
        d.get("FailureReason"), workers["train"].log_path.read_text()[-3000:])
    extra = sm.describe_model(ModelName="tiny-eagle")["PrimaryContainer"][
        "AdditionalModelDataSources"]  # the output model, registered by the train worker
    assert extra[0]["ChannelName"] == "eagle_model"

    # Which worker ran which task, from each worker's own JSON log.
    train, serve = workers["train"], workers["serve"]
    assert train.proc.poll() is None and serve.proc.poll() is None
    train_log, serve_log = train.entries(), serve.entries()
    job_ref, endpoint_ref = f"{ACCOUNT}/{JOB}", f"{ACCOUNT}/{ENDPOINT}"  # <account>/<name>
    assert any(e.get("job") == job_ref and e["message"] ==
               f"job {JOB} claimed by worker {children.HOST}:{train.proc.pid}" for e in train_log)
    assert any(e.get("job") == job_ref and "eaglenest.optimize" in e["message"]
               and "succeeded" in e["message"] and "COMPLETED" in e["message"]
               for e in train_log), train_log[-5:]
    assert any(e.get("endpoint") == endpoint_ref and "eaglenest.endpoint.create" in e["message"]
               and "succeeded" in e["message"] and "InService" in e["message"]
               for e in serve_log), serve_log[-5:]
    # ... and neither touched the other's queue
    assert not any("endpoint" in e or "eaglenest.endpoint" in e["message"] for e in train_log)
    assert not any("job" in e or "eaglenest.optimize" in e["message"] for e in serve_log)
    for w in (train, serve):
        ready = [e["message"] for e in w.entries() if e["message"].endswith(" ready.")]
        assert ready == [f"eaglenest-{w.proc.pid}@{HOST} ready."], ready

