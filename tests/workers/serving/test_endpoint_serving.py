"""Endpoints serve for real: CreateEndpoint starts the embedded engine's server through a
real Celery worker; sagemaker-runtime InvokeEndpoint (LMI and OpenAI bodies, streaming)
reaches it; Data Capture lands in the store; UpdateEndpoint and DeleteEndpoint manage the
processes; a restart brings a dead endpoint back."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import time

import httpx
import pytest
from botocore.exceptions import ClientError, WaiterError

from tests.support.jobs import upload
from tests.support.processes import wait_group_gone
from tests.support.stack import Stack

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"
#: OMP_NUM_THREADS reaches the model server's process like any container Environment entry
ENV = {"EAGLENEST_SERVING_BACKEND": "embedded", "EAGLENEST_NUM_SPECULATIVE_TOKENS": "3",
       "EAGLENEST_MAX_MODEL_LEN": "512", "OMP_NUM_THREADS": "1"}


def container(head: bool) -> dict:
    c = {"Image": "eaglenest", "Environment": ENV, "ModelDataSource": {"S3DataSource": {
        "S3Uri": "s3://models/tiny/", "S3DataType": "S3Prefix", "CompressionType": "None"}}}
    if head:
        c["AdditionalModelDataSources"] = [{"ChannelName": "eagle_model", "S3DataSource": {
            "S3Uri": "s3://models/tiny-head/", "S3DataType": "S3Prefix",
            "CompressionType": "None"}}]
    return c


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_llama_dir, tiny_eagle3_dir):
    s = Stack(tmp_path_factory.mktemp("serving"),
              extra_env={"EAGLENEST_CAPTURE_FLUSH_SECONDS": "1"}).start()
    upload(s, tiny_llama_dir, "s3://models/tiny/")
    upload(s, tiny_eagle3_dir, "s3://models/tiny-head/")
    sm = s.client()
    sm.create_model(ModelName="tiny-base", ExecutionRoleArn=ROLE,
                    PrimaryContainer=container(False))
    sm.create_model(ModelName="tiny-eagle", ExecutionRoleArn=ROLE,
                    PrimaryContainer=container(True))
    yield s
    s.stop()


def make_config(sm, name: str, model: str, capture: bool = False) -> None:
    kw = {}
    if capture:
        kw["DataCaptureConfig"] = {"EnableCapture": True, "InitialSamplingPercentage": 100,
                                   "DestinationS3Uri": "s3://capture/traffic",
                                   "CaptureOptions": [{"CaptureMode": "Input"},
                                                      {"CaptureMode": "Output"}]}
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": model, "InstanceType": "ml.g5.2xlarge",
        "InitialInstanceCount": 1, "ContainerStartupHealthCheckTimeoutInSeconds": 120}], **kw)


def in_service(sm, name: str) -> dict:
    sm.get_waiter("endpoint_in_service").wait(
        EndpointName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 180})
    return sm.describe_endpoint(EndpointName=name)


def lmi(rt, name: str, text: str, **kw) -> dict:
    r = rt.invoke_endpoint(EndpointName=name, ContentType="application/json", Body=json.dumps(
        {"inputs": text, "parameters": {"max_new_tokens": 12, "temperature": 0}}), **kw)
    assert r["InvokedProductionVariant"] == "AllTraffic"
    return json.loads(r["Body"].read())


def test_serve_invoke_stream_capture_update_delete(stack):
    sm, rt = stack.client(), stack.client("sagemaker-runtime")
    make_config(sm, "cfg-eagle", "tiny-eagle", capture=True)
    sm.create_endpoint(EndpointName="ep", EndpointConfigName="cfg-eagle")
    d = in_service(sm, "ep")
    assert d["ProductionVariants"][0]["VariantName"] == "AllTraffic"
    assert d["DataCaptureConfig"]["CaptureStatus"] == "Started"
    out = lmi(rt, "ep", "Natalia sold 48 clips")
    assert isinstance(out["generated_text"], str) and out["generated_text"]
    chat = rt.invoke_endpoint(EndpointName="ep", ContentType="application/json", Body=json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}))
    assert json.loads(chat["Body"].read())["object"] == "chat.completion"
    stream = rt.invoke_endpoint_with_response_stream(
        EndpointName="ep", ContentType="application/json", Body=json.dumps(
            {"inputs": "Natalia sold 48 clips", "parameters": {"max_new_tokens": 12}}))
    lines = [json.loads(x) for e in stream["Body"] for x in
             e["PayloadPart"]["Bytes"].decode().splitlines() if x]
    assert lines[-1]["generated_text"] == out["generated_text"]
    assert "".join(x["token"]["text"] for x in lines[:-1]) == out["generated_text"]
    records = wait_captured(stack, "ep", 3)
    assert any(r.get("prompt") == "Natalia sold 48 clips"
               and r.get("completion") == out["generated_text"] for r in records)
    assert any(r.get("messages", [{}])[-1].get("role") == "assistant" for r in records)
    old_url = _server_url(stack, "ep")
    make_config(sm, "cfg-base", "tiny-base")
    sm.update_endpoint(EndpointName="ep", EndpointConfigName="cfg-base")
    assert sm.describe_endpoint(EndpointName="ep")["EndpointStatus"] == "Updating"
    lmi(rt, "ep", "still serving during the update")
    d = in_service(sm, "ep")
    assert d["EndpointConfigName"] == "cfg-base"
    assert _server_url(stack, "ep") != old_url
    _gone(old_url)
    assert lmi(rt, "ep", "Natalia sold 48 clips") == out  # greedy is lossless
    new_url = _server_url(stack, "ep")
    sm.delete_endpoint(EndpointName="ep")
    sm.get_waiter("endpoint_deleted").wait(
        EndpointName="ep", WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    _gone(new_url)


def _server_url(stack: Stack, name: str) -> str:
    from eaglenest.db.session import Database
    from eaglenest.db.tables import EndpointRow

    db = Database(stack.database_url)
    try:
        with db.session() as s:
            row = s.query(EndpointRow).filter_by(name=name).one()
            return str(row.deployment["Servers"]["AllTraffic"]["url"])
    finally:
        db.dispose()


def _get(stack: Stack, url: str, path: str, timeout: float = 10) -> httpx.Response:
    """GET a model server of the stack with its instance secret (foundation/http/instance_auth.py:
    without it every request is refused)."""
    from eaglenest.db.session import Database
    from eaglenest.db.tables import EndpointRow
    from eaglenest.foundation.deployment import instances_of

    db = Database(stack.database_url)
    try:
        with db.session() as s:
            secrets = {i["url"]: i.get("secret") for row in s.query(EndpointRow)
                       for record in (row.deployment.get("Servers") or {}).values()
                       for i in instances_of(record)}
    finally:
        db.dispose()
    assert secrets.get(url), f"no instance with a secret at {url}"
    return httpx.get(f"{url}{path}", timeout=timeout,
                     headers={"Authorization": f"Bearer {secrets[url]}"})


def _gone(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/health", timeout=1)
        except httpx.HTTPError:
            return
        time.sleep(0.3)
    raise AssertionError(f"{url} still answers")


def test_runtime_errors(stack):
    rt = stack.client("sagemaker-runtime")
    with pytest.raises(ClientError) as exc:
        rt.invoke_endpoint(EndpointName="nope", Body=b"{}", ContentType="application/json")
    assert exc.value.response["Error"]["Code"] == "ValidationError"
    assert exc.value.response["Error"]["Message"] == \
        "Endpoint nope of account 123456789012 not found."
    sm = stack.client()
    make_config(sm, "cfg-err", "tiny-base")
    sm.create_endpoint(EndpointName="ep-err", EndpointConfigName="cfg-err")
    in_service(sm, "ep-err")
    # SageMaker never judges a body: what the container does not understand is its 4xx,
    # which the caller gets as ModelError 424 with the container's status and message
    log_group = "arn:aws:logs:us-east-1:123456789012:log-group:/aws/sagemaker/Endpoints/ep-err"
    for body, content_type, status, text in (
            (b"not json", "application/json", 400, "Request body is not valid JSON."),
            (b"1,2,3", "text/csv", 415, "Content type text/csv is not supported"),
            (b'{"x": 1}', "application/json", 400, "Request body must be LMI style"),
            (json.dumps({"inputs": "x", "parameters": {"top_p": 7}}).encode(),
             "application/json", 400, "top_p")):
        with pytest.raises(rt.exceptions.ModelError) as exc:
            rt.invoke_endpoint(EndpointName="ep-err", Body=body, ContentType=content_type,
                               Accept="text/csv")
        r = exc.value.response
        assert (r["Error"]["Code"], r["ResponseMetadata"]["HTTPStatusCode"]) == ("ModelError", 424)
        assert r["OriginalStatusCode"] == status, r
        assert text in r["OriginalMessage"], r
        assert r["Error"]["Message"].startswith(
            f'Received client error ({status}) from primary with message "')
        assert r["LogStreamArn"] == log_group
    out = rt.invoke_endpoint(EndpointName="ep-err", ContentType="text/plain; charset=utf-8",
                             Body=b"Natalia sold 48 clips")
    assert json.loads(out["Body"].read())["generated_text"]
    # what SageMaker itself checks stays a ValidationError from the service (a body over
    # 6 MB: 413, refused before it is read, as SageMaker's front end does)
    for kw, text, status in (
            ({"TargetVariant": "v" * 64}, "at 'targetVariant' failed to satisfy "
             "constraint: Member must have length less than or equal to 63", 400),
            ({"InferenceId": "i" * 65}, "at 'inferenceId' failed to satisfy "
             "constraint: Member must have length less than or equal to 64", 400),
            ({"Body": b"x" * (6291456 + 1)}, "at 'body' failed to satisfy "
             "constraint: Member must have length less than or equal to 6291456", 413)):
        with pytest.raises(ClientError) as exc:
            rt.invoke_endpoint(**{"EndpointName": "ep-err", "ContentType": "text/plain",
                                  "Body": b"hi", **kw})
        assert exc.value.response["Error"]["Code"] == "ValidationError"
        assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
        assert text in exc.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as exc:  # the model server's 400, before any frame
        rt.invoke_endpoint_with_response_stream(
            EndpointName="ep-err", ContentType="application/json",
            Body=json.dumps({"inputs": "x", "parameters": {"top_p": 7}}))
    assert exc.value.response["Error"]["Code"] == "ModelError"
    assert "(400)" in exc.value.response["Error"]["Message"]
    assert exc.value.response["OriginalStatusCode"] == 400
    with pytest.raises(ClientError) as exc:  # and a body the container cannot read
        rt.invoke_endpoint_with_response_stream(EndpointName="ep-err", ContentType="text/csv",
                                                Body=b"a,b")
    assert exc.value.response["Error"]["Code"] == "ModelError"
    assert exc.value.response["OriginalStatusCode"] == 415
    with pytest.raises(ClientError) as exc:
        rt.invoke_endpoint(EndpointName="ep-err", ContentType="application/json",
                           Body=b"{}", TargetVariant="Other")
    assert exc.value.response["Error"]["Code"] == "ValidationError"
    sm.delete_endpoint(EndpointName="ep-err")


def test_bad_model_files_fail_the_endpoint(stack, tiny_llama_dir, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama_dir, broken)
    (broken / "config.json").unlink()
    upload(stack, broken, "s3://models/broken/")
    sm = stack.client()
    c = container(False)
    c["ModelDataSource"]["S3DataSource"]["S3Uri"] = "s3://models/broken/"
    sm.create_model(ModelName="broken", ExecutionRoleArn=ROLE, PrimaryContainer=c)
    make_config(sm, "cfg-broken", "broken")
    sm.create_endpoint(EndpointName="ep-broken", EndpointConfigName="cfg-broken")
    with pytest.raises(WaiterError):
        in_service(sm, "ep-broken")
    d = sm.describe_endpoint(EndpointName="ep-broken")
    assert d["EndpointStatus"] == "Failed"
    assert "config.json" in d["FailureReason"]


def test_restart_recovers_dead_endpoint(stack):
    sm = stack.client()
    make_config(sm, "cfg-rec", "tiny-base")
    sm.create_endpoint(EndpointName="ep-rec", EndpointConfigName="cfg-rec")
    in_service(sm, "ep-rec")
    url = _server_url(stack, "ep-rec")
    stack.stop()  # graceful: the worker stops its serving processes
    _gone(url)
    stack.start()
    deadline = time.monotonic() + 180
    while _server_url(stack, "ep-rec") == url:  # the worker's reconciliation restarts it
        assert time.monotonic() < deadline, stack.log()[-3000:]
        time.sleep(0.5)
    d = in_service(stack.client(), "ep-rec")
    assert d["EndpointStatus"] == "InService"
    assert _get(stack, _server_url(stack, "ep-rec"), "/health").status_code == 200
    lmi(stack.client("sagemaker-runtime"), "ep-rec", "back again")
    stack.client().delete_endpoint(EndpointName="ep-rec")


def wait_captured(stack: Stack, endpoint: str, n: int, timeout: float = 30) -> list[dict]:
    """Captured records (files are rolled every second in these tests)."""
    root = stack.data_dir / "s3" / "capture" / "traffic" / endpoint
    deadline = time.monotonic() + timeout
    while True:
        records = [json.loads(line) for p in sorted(root.rglob("*.jsonl"))
                   for line in p.read_text().splitlines()]
        if len(records) >= n or time.monotonic() > deadline:
            assert len(records) == n, records
            return records
        time.sleep(0.3)


def test_killed_backend_is_model_error_then_recovered(stack):
    import os
    import signal

    sm, rt = stack.client(), stack.client("sagemaker-runtime")
    make_config(sm, "cfg-kill", "tiny-base")
    sm.create_endpoint(EndpointName="ep-kill", EndpointConfigName="cfg-kill")
    in_service(sm, "ep-kill")
    url = _server_url(stack, "ep-kill")
    os.killpg(_server_pid(stack, "ep-kill"), signal.SIGKILL)
    _gone(url)
    with pytest.raises(ClientError) as exc:
        lmi(rt, "ep-kill", "anyone there?")
    assert exc.value.response["Error"]["Code"] == "ModelError"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 424
    with pytest.raises(ClientError) as exc:  # streaming too: the error before any frame
        rt.invoke_endpoint_with_response_stream(
            EndpointName="ep-kill", ContentType="application/json",
            Body=json.dumps({"inputs": "anyone?", "parameters": {"max_new_tokens": 4}}))
    assert exc.value.response["Error"]["Code"] == "ModelError"
    assert "did not answer" in exc.value.response["Error"]["Message"]
    assert exc.value.response["Error"]["Message"].startswith("Received server error (500)")
    deadline = time.monotonic() + 180  # the failed call had a serve worker check it
    while _server_url(stack, "ep-kill") == url:
        assert time.monotonic() < deadline, stack.log()[-3000:]
        time.sleep(0.5)
    assert in_service(sm, "ep-kill")["EndpointStatus"] == "InService"
    lmi(rt, "ep-kill", "back")
    sm.delete_endpoint(EndpointName="ep-kill")


def _server_pid(stack: Stack, name: str) -> int:
    from eaglenest.db.session import Database
    from eaglenest.db.tables import EndpointRow

    db = Database(stack.database_url)
    try:
        with db.session() as s:
            row = s.query(EndpointRow).filter_by(name=name).one()
            return int(row.deployment["Servers"]["AllTraffic"]["pid"])
    finally:
        db.dispose()


def test_two_variants_split_traffic_and_target_variant(stack):
    sm, rt = stack.client(), stack.client("sagemaker-runtime")
    variants = [{"VariantName": v, "ModelName": "tiny-base", "InstanceType": "ml.g5.2xlarge",
                 "InitialInstanceCount": 1, "InitialVariantWeight": w,
                 "ContainerStartupHealthCheckTimeoutInSeconds": 120}
                for v, w in (("A", 1.0), ("B", 1.0))]
    sm.create_endpoint_config(EndpointConfigName="cfg-ab", ProductionVariants=variants)
    sm.create_endpoint(EndpointName="ep-ab", EndpointConfigName="cfg-ab")
    d = in_service(sm, "ep-ab")
    assert sorted(v["VariantName"] for v in d["ProductionVariants"]) == ["A", "B"]
    # what serves each variant: the container's Image as given, the backend that runs it
    embedded = f"eaglenest/embedded:{importlib.metadata.version('EagleNest')}"
    for v in d["ProductionVariants"]:
        [image] = v["DeployedImages"]
        assert image["SpecifiedImage"] == "eaglenest" and image["ResolvedImage"] == embedded
        assert image["ResolutionTime"] >= d["CreationTime"], d
    status = subprocess.run([sys.executable, "-m", "eaglenest.cli", "status"],
                            env=stack.env(), capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    for v in ("A", "B"):
        assert f"    variant {v}: {embedded} (Image eaglenest), 1 instance\n" in status.stdout
    body = json.dumps({"inputs": "x", "parameters": {"max_new_tokens": 1}})
    seen = {rt.invoke_endpoint(EndpointName="ep-ab", ContentType="application/json",
                               Body=body)["InvokedProductionVariant"] for _ in range(24)}
    assert seen == {"A", "B"}  # 1 - 2 * 0.5**24 chance
    for v in ("A", "B"):
        r = rt.invoke_endpoint(EndpointName="ep-ab", ContentType="application/json", Body=body,
                               TargetVariant=v, CustomAttributes="trace=1")
        assert r["InvokedProductionVariant"] == v
        assert r["CustomAttributes"] == "trace=1"
    sm.delete_endpoint(EndpointName="ep-ab")


def test_captured_traffic_trains_the_next_head(stack):
    """The adaptive loop: serve, invoke, train on the capture, redeploy with UpdateEndpoint."""
    sm, rt = stack.client(), stack.client("sagemaker-runtime")
    make_config(sm, "cfg-loop", "tiny-base", capture=True)
    sm.create_endpoint(EndpointName="ep-loop", EndpointConfigName="cfg-loop")
    in_service(sm, "ep-loop")
    prompts = ["Natalia sold 48 clips", "def add(a, b):", "The quick brown fox",
               "import os", "user assistant system"]
    for p in prompts:
        lmi(rt, "ep-loop", p)
    assert {r["prompt"] for r in wait_captured(stack, "ep-loop", 5)} == set(prompts)
    sm.create_optimization_job(
        OptimizationJobName="from-traffic", RoleArn=ROLE,
        ModelSource={"SageMakerModel": {"ModelName": "tiny-base"}},
        DeploymentInstanceType="ml.g5.2xlarge",
        OptimizationEnvironment={"EAGLENEST_MAX_STEPS": "3", "EAGLENEST_HOLDOUT": "1",
                                 "EAGLENEST_BENCHMARK": "0", "EAGLENEST_MAX_LENGTH": "128"},
        OptimizationConfigs=[{"ModelSpeculativeDecodingConfig": {
            "Technique": "EAGLE", "TrainingDataSource": {
                "S3Uri": "s3://capture/traffic/ep-loop/", "S3DataType": "S3Prefix"}}}],
        OutputConfig={"S3OutputLocation": "s3://output/loop/",
                      "SageMakerModel": {"ModelName": "tiny-from-traffic"}},
        StoppingCondition={"MaxRuntimeInSeconds": 600})
    deadline = time.monotonic() + 300
    while (d := sm.describe_optimization_job(OptimizationJobName="from-traffic"))[
            "OptimizationJobStatus"] not in ("COMPLETED", "FAILED"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert d["OptimizationJobStatus"] == "COMPLETED", d.get("FailureReason")
    make_config(sm, "cfg-loop-2", "tiny-from-traffic")
    sm.update_endpoint(EndpointName="ep-loop", EndpointConfigName="cfg-loop-2")
    assert in_service(sm, "ep-loop")["EndpointConfigName"] == "cfg-loop-2"
    before = lmi(rt, "ep-loop", prompts[0])
    assert before["generated_text"]
    sm.delete_endpoint(EndpointName="ep-loop")


def test_failed_update_rolls_back_and_keeps_serving(stack, tiny_llama_dir, tmp_path):
    import shutil

    sm, rt = stack.client(), stack.client("sagemaker-runtime")
    make_config(sm, "cfg-rb", "tiny-base")
    sm.create_endpoint(EndpointName="ep-rb", EndpointConfigName="cfg-rb")
    in_service(sm, "ep-rb")
    broken = tmp_path / "nocfg"
    shutil.copytree(tiny_llama_dir, broken)
    (broken / "tokenizer_config.json").unlink()
    upload(stack, broken, "s3://models/nocfg/")
    c = container(False)
    c["ModelDataSource"]["S3DataSource"]["S3Uri"] = "s3://models/nocfg/"
    sm.create_model(ModelName="nocfg", ExecutionRoleArn=ROLE, PrimaryContainer=c)
    make_config(sm, "cfg-rb-bad", "nocfg")
    sm.update_endpoint(EndpointName="ep-rb", EndpointConfigName="cfg-rb-bad")
    d = in_service(sm, "ep-rb")
    assert d["EndpointConfigName"] == "cfg-rb"
    assert "rolled back" in d["FailureReason"] and "tokenizer_config.json" in d["FailureReason"]
    lmi(rt, "ep-rb", "still here")
    sm.delete_endpoint(EndpointName="ep-rb")


def _requests_served(stack: Stack, url: str) -> float:
    """vllm:request_success_total from one serving process's /metrics."""
    for line in _get(stack, url, "/metrics", timeout=5).text.splitlines():
        if line.startswith("vllm:request_success_total"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{url}/metrics has no vllm:request_success_total")


def test_instance_count_starts_spreads_recovers_and_stops_each(stack):
    """InitialInstanceCount=2: two processes, requests alternate between them, a killed one
    is skipped and restarted alone, and DeleteEndpoint stops both."""
    import os
    import signal

    sm, rt = stack.client(), stack.client("sagemaker-runtime")
    sm.create_endpoint_config(EndpointConfigName="cfg-two", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "tiny-eagle", "InstanceType": "ml.g5.2xlarge",
        "InitialInstanceCount": 2, "ContainerStartupHealthCheckTimeoutInSeconds": 120}])
    sm.create_endpoint(EndpointName="ep-two", EndpointConfigName="cfg-two")
    d = in_service(sm, "ep-two")
    assert d["ProductionVariants"][0]["CurrentInstanceCount"] == 2
    assert d["ProductionVariants"][0]["DesiredInstanceCount"] == 2
    first = stack.deployment("ep-two")["Servers"]["AllTraffic"]["instances"]
    assert len({i["url"] for i in first}) == 2 and len({i["pid"] for i in first}) == 2
    assert all(_get(stack, i["url"], "/health").status_code == 200 for i in first)
    out = {json.dumps(lmi(rt, "ep-two", "Natalia sold 48 clips")) for _ in range(6)}
    assert len(out) == 1  # greedy: whichever instance answered, the same text
    assert [_requests_served(stack, i["url"]) for i in first] == [3.0, 3.0]  # round-robin

    os.killpg(first[1]["pid"], signal.SIGKILL)
    _gone(first[1]["url"])
    for _ in range(4):  # the dead instance is skipped: no request fails
        assert json.dumps(lmi(rt, "ep-two", "Natalia sold 48 clips")) in out
    deadline = time.monotonic() + 180  # and a serve worker restarts it, and only it
    while (now := stack.deployment("ep-two")["Servers"]["AllTraffic"]["instances"])[1] == first[1]:
        assert time.monotonic() < deadline, stack.log()[-3000:]
        time.sleep(0.5)
    assert now[0] == first[0] and now[1]["url"] != first[1]["url"]
    assert in_service(sm, "ep-two")["ProductionVariants"][0]["CurrentInstanceCount"] == 2
    before = [_requests_served(stack, i["url"]) for i in now]
    for _ in range(2):
        lmi(rt, "ep-two", "Natalia sold 48 clips")
    assert [_requests_served(stack, i["url"]) - b for i, b in zip(now, before, strict=True)] == [1.0, 1.0]

    sm.delete_endpoint(EndpointName="ep-two")
    sm.get_waiter("endpoint_deleted").wait(
        EndpointName="ep-two", WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    for inst in now:
        _gone(inst["url"])
        wait_group_gone(inst["pid"])


def _metric(stack: Stack, url: str, name: str) -> float:
    text = _get(stack, url, "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name))


def test_caller_gone_mid_stream_stops_generation(stack):
    """A caller that closes its stream mid-reply closes the proxy's connection to the model
    server, which stops generating (the engine's generated-token counter stays well short
    of what the same request produces when read to the end); the container's Environment
    reached the model server's process."""
    import psutil
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    from botocore.eventstream import EventStreamBuffer

    from tests.support.stack import ACCESS_KEY, REGION, SECRET_KEY

    sm, rt = stack.client(), stack.client("sagemaker-runtime")
    make_config(sm, "cfg-gone", "tiny-base")
    sm.create_endpoint(EndpointName="gone", EndpointConfigName="cfg-gone")
    in_service(sm, "gone")
    server = _server_url(stack, "gone")
    pid = int(stack.deployment("gone")["Servers"]["AllTraffic"]["pid"])
    assert psutil.Process(pid).environ()["OMP_NUM_THREADS"] == "1"
    body = json.dumps({"prompt": "The quick brown fox", "max_tokens": 400, "temperature": 0,
                       "ignore_eos": True})
    full = json.loads(rt.invoke_endpoint(EndpointName="gone", ContentType="application/json",
                                         Body=body)["Body"].read())
    assert full["usage"]["completion_tokens"] == 400
    before = _metric(stack, server, "vllm:generation_tokens_total")
    url = f"{stack.url}/endpoints/gone/invocations-response-stream"
    req = AWSRequest("POST", url, data=body, headers={"Content-Type": "application/json"})
    SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "sagemaker", REGION).add_auth(req)
    frames = 0
    with httpx.stream("POST", url, content=body, headers=dict(req.headers), timeout=60) as r:
        buf = EventStreamBuffer()
        for chunk in r.iter_bytes():
            buf.add_data(chunk)
            frames += sum(1 for _ in buf)
            if frames >= 3:
                break  # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 30
    while _metric(stack, server, "vllm:num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _metric(stack, server, "vllm:num_requests_running") == 0
    generated = _metric(stack, server, "vllm:generation_tokens_total") - before
    assert 3 <= generated < 200, generated
    sm.delete_endpoint(EndpointName="gone")


def test_runtime_metrics_count_invocations_frames_and_proxy_time(stack):
    """The API's /metrics counts sagemaker-runtime invocations by code, the frames relayed
    and the proxy's own time (waiting on the model server excluded: it stays far below the
    invocations' wall time)."""
    sm, rt = stack.client(), stack.client("sagemaker-runtime")
    make_config(sm, "cfg-metrics", "tiny-base")
    sm.create_endpoint(EndpointName="metered", EndpointConfigName="cfg-metrics")
    in_service(sm, "metered")

    def scrape() -> dict[str, float]:
        text = httpx.get(f"{stack.url}/metrics", timeout=10).text
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line.startswith("eaglenest_runtime_")}

    before = scrape()
    body = json.dumps({"prompt": "The quick brown fox", "max_tokens": 20, "temperature": 0,
                       "ignore_eos": True})
    start = time.monotonic()
    stream = rt.invoke_endpoint_with_response_stream(
        EndpointName="metered", ContentType="application/json", Body=body)
    frames = sum(1 for _ in stream["Body"])
    wall = time.monotonic() - start
    with pytest.raises(ClientError):
        rt.invoke_endpoint(EndpointName="no-such-endpoint", ContentType="application/json",
                           Body=body)
    after = scrape()

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta('eaglenest_runtime_invocations_total{code="OK"}') == 1
    assert delta('eaglenest_runtime_invocations_total{code="ValidationError"}') == 1
    assert delta("eaglenest_runtime_frames_total") == frames >= 2
    assert 0 < delta("eaglenest_runtime_proxy_seconds_total") < wall / 2
    # the forward (request in -> out to the model server) is part of the proxy's time
    forward = delta("eaglenest_runtime_forward_seconds_total")
    assert 0 < forward < delta("eaglenest_runtime_proxy_seconds_total")
    sm.delete_endpoint(EndpointName="metered")


def _counts(described: dict) -> list[dict]:
    """DescribeEndpoint's ProductionVariants without their DeployedImages."""
    return [{k: v for k, v in variant.items() if k != "DeployedImages"}
            for variant in described["ProductionVariants"]]


def test_weights_and_capacities_split_traffic_and_scale_live(stack):
    """UpdateEndpointWeightsAndCapacities: Updating (serving meanwhile) -> InService, Desired*
    then Current* as AWS reports them; the router follows the new weights (3:1 over 400
    invocations, within 4 standard deviations of a binomial); instances start and stop."""
    from concurrent.futures import ThreadPoolExecutor

    sm, rt = stack.client(), stack.client("sagemaker-runtime")
    variants = [{"VariantName": v, "ModelName": "tiny-base", "InstanceType": "ml.g5.2xlarge",
                 "InitialInstanceCount": 1, "InitialVariantWeight": 1.0,
                 "ContainerStartupHealthCheckTimeoutInSeconds": 120} for v in ("A", "B")]
    sm.create_endpoint_config(EndpointConfigName="cfg-wc", ProductionVariants=variants)
    sm.create_endpoint(EndpointName="ep-wc", EndpointConfigName="cfg-wc")
    in_service(sm, "ep-wc")
    first_b = stack.deployment("ep-wc")["Servers"]["B"]["instances"]
    sm.update_endpoint_weights_and_capacities(EndpointName="ep-wc", DesiredWeightsAndCapacities=[
        {"VariantName": "A", "DesiredWeight": 3.0, "DesiredInstanceCount": 2},
        {"VariantName": "B", "DesiredWeight": 1.0}])
    d = sm.describe_endpoint(EndpointName="ep-wc")
    assert d["EndpointStatus"] == "Updating"
    assert _counts(d)[0] == {"VariantName": "A", "CurrentWeight": 1.0,
                             "DesiredWeight": 3.0, "CurrentInstanceCount": 1,
                             "DesiredInstanceCount": 2}
    body = json.dumps({"inputs": "x", "parameters": {"max_new_tokens": 1}})
    rt.invoke_endpoint(EndpointName="ep-wc", ContentType="application/json", Body=body)
    d = in_service(sm, "ep-wc")
    assert _counts(d) == [
        {"VariantName": "A", "CurrentWeight": 3.0, "DesiredWeight": 3.0,
         "CurrentInstanceCount": 2, "DesiredInstanceCount": 2},
        {"VariantName": "B", "CurrentWeight": 1.0, "DesiredWeight": 1.0,
         "CurrentInstanceCount": 1, "DesiredInstanceCount": 1}]
    servers = stack.deployment("ep-wc")["Servers"]
    a_instances = servers["A"]["instances"]
    assert len(a_instances) == 2 and servers["B"]["instances"] == first_b  # B untouched
    assert all(_get(stack, i["url"], "/health").status_code == 200 for i in a_instances)
    time.sleep(2.5)  # the runtime's route cache (1 s) has the new weights

    def invoke(_: int) -> str:
        return rt.invoke_endpoint(EndpointName="ep-wc", ContentType="application/json",
                                  Body=body)["InvokedProductionVariant"]

    with ThreadPoolExecutor(4) as pool:
        seen = list(pool.map(invoke, range(400)))
    assert 300 - 35 <= seen.count("A") <= 300 + 35, seen.count("A")  # sd 8.66
    assert seen.count("A") + seen.count("B") == 400
    assert invoke(0) in ("A", "B")
    r = rt.invoke_endpoint(EndpointName="ep-wc", ContentType="application/json", Body=body,
                           TargetVariant="B")
    assert r["InvokedProductionVariant"] == "B"

    sm.update_endpoint_weights_and_capacities(EndpointName="ep-wc", DesiredWeightsAndCapacities=[
        {"VariantName": "A", "DesiredInstanceCount": 1}])
    d = in_service(sm, "ep-wc")
    assert d["ProductionVariants"][0]["CurrentInstanceCount"] == 1
    assert d["ProductionVariants"][0]["CurrentWeight"] == 3.0  # kept from the first change
    assert stack.deployment("ep-wc")["Servers"]["A"]["instances"] == a_instances[:1]
    _gone(a_instances[1]["url"])
    wait_group_gone(a_instances[1]["pid"])
    rt.invoke_endpoint(EndpointName="ep-wc", ContentType="application/json", Body=body,
                       TargetVariant="A")
    sm.delete_endpoint(EndpointName="ep-wc")


def test_update_endpoint_retains_variant_properties(stack):
    """RetainAllVariantProperties keeps the running instance count and weight (not the new
    config's), ExcludeRetainedVariantProperties takes Data Capture from the new config;
    without it the new config's values apply; LastDeploymentConfig follows the requests."""
    sm = stack.client()
    one = {"VariantName": "AllTraffic", "ModelName": "tiny-base",
           "InstanceType": "ml.g5.2xlarge", "InitialInstanceCount": 1,
           "InitialVariantWeight": 1.0, "ContainerStartupHealthCheckTimeoutInSeconds": 120}
    sm.create_endpoint_config(EndpointConfigName="cfg-keep-1", ProductionVariants=[one])
    sm.create_endpoint_config(
        EndpointConfigName="cfg-keep-2",
        ProductionVariants=[{**one, "InitialInstanceCount": 2, "InitialVariantWeight": 5.0}],
        DataCaptureConfig={"EnableCapture": True, "InitialSamplingPercentage": 50,
                           "DestinationS3Uri": "s3://capture/keep",
                           "CaptureOptions": [{"CaptureMode": "Input"}]})
    sm.create_endpoint(EndpointName="ep-keep", EndpointConfigName="cfg-keep-1")
    in_service(sm, "ep-keep")
    policy = {"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {
        "Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 0}, "TerminationWaitInSeconds": 0}}
    sm.update_endpoint(EndpointName="ep-keep", EndpointConfigName="cfg-keep-2",
                       RetainAllVariantProperties=True, DeploymentConfig=policy,
                       ExcludeRetainedVariantProperties=[
                           {"VariantPropertyType": "DataCaptureConfig"}])
    d = in_service(sm, "ep-keep")
    assert d["EndpointConfigName"] == "cfg-keep-2"
    assert _counts(d) == [{"VariantName": "AllTraffic", "CurrentWeight": 1.0,
                           "DesiredWeight": 1.0, "CurrentInstanceCount": 1,
                           "DesiredInstanceCount": 1}]
    assert len(stack.deployment("ep-keep")["Servers"]["AllTraffic"]["instances"]) == 1
    assert d["DataCaptureConfig"]["CurrentSamplingPercentage"] == 50
    assert d["LastDeploymentConfig"] == policy
    sm.update_endpoint(EndpointName="ep-keep", EndpointConfigName="cfg-keep-2",
                       RetainDeploymentConfig=True)
    d = in_service(sm, "ep-keep")
    assert _counts(d) == [{"VariantName": "AllTraffic", "CurrentWeight": 5.0,
                           "DesiredWeight": 5.0, "CurrentInstanceCount": 2,
                           "DesiredInstanceCount": 2}]
    assert len(stack.deployment("ep-keep")["Servers"]["AllTraffic"]["instances"]) == 2
    assert d["LastDeploymentConfig"] == policy
    sm.update_endpoint(EndpointName="ep-keep", EndpointConfigName="cfg-keep-1",
                       RetainAllVariantProperties=True)  # keeps 2 instances and capture
    d = in_service(sm, "ep-keep")
    assert d["ProductionVariants"][0]["CurrentInstanceCount"] == 2
    assert d["DataCaptureConfig"]["DestinationS3Uri"] == "s3://capture/keep"
    assert "LastDeploymentConfig" not in d
    sm.delete_endpoint(EndpointName="ep-keep")
