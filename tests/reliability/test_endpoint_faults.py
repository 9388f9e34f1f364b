"""Endpoint faults (issue #22): a serving start that fails in any way ends in Failed with
the reason; no endpoint stays in transition past EAGLENEST_ENDPOINT_TRANSITION_SECONDS;
an API SIGKILLed right after answering loses no Data Capture record; DeleteEndpoint never
signals a process its record does not match."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from botocore.exceptions import ClientError

from eaglenest.db.session import Database
from eaglenest.db.tables import EndpointRow
from tests.reliability.reliability_helpers import (
    api_answers,
    api_pid,
    assert_no_strays,
    make_endpoint,
    serving_env,
    stack_processes,
)
from tests.support.jobs import upload
from tests.support.stack import Stack, wait_endpoint, wait_for


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_llama_dir):
    s = Stack(tmp_path_factory.mktemp("endpoint-faults")).start()
    upload(s, tiny_llama_dir, "s3://models/tiny/")
    corrupt = tmp_path_factory.mktemp("corrupt") / "model.tar.gz"
    corrupt.write_bytes(b"\x1f\x8b\x08\x00 this is not a gzip stream")
    upload(s, corrupt, "s3://models/corrupt/model.tar.gz")
    yield s
    s.stop()


def test_an_option_the_plan_cannot_read_is_refused_at_create(stack):
    """A bad length is refused by CreateEndpoint (db/gpu_fit.py reads the container's
    options with the worker's reader), so no endpoint is left to fail."""
    sm = stack.client()
    with pytest.raises(ClientError) as exc:
        make_endpoint(sm, "bad-len", "s3://models/tiny/",
                      serving_env(EAGLENEST_MAX_MODEL_LEN="abc"))
    error = exc.value.response["Error"]
    assert error["Code"] == "ValidationException"
    assert "EAGLENEST_MAX_MODEL_LEN='abc' must be a positive integer" in error["Message"]
    assert not sm.list_endpoints(NameContains="bad-len")["Endpoints"]
    assert_no_strays(stack)


@pytest.mark.parametrize(("env", "uri", "url_only", "reason"), [
    (serving_env(), "s3://models/corrupt/model.tar.gz", True,
     "Variant AllTraffic: s3://models/corrupt/model.tar.gz: model.tar.gz is not a readable "
     ".tar.gz archive"),
], ids=["corrupt-tar-gz"])
def test_a_failing_start_ends_in_failed_with_the_reason(stack, env, uri, url_only, reason):
    sm = stack.client()
    name = f"bad-{len(reason)}"
    make_endpoint(sm, name, uri, env, url_only=url_only)
    d = wait_endpoint(sm, name, {"InService", "Failed"}, 120, stack)
    assert d["EndpointStatus"] == "Failed"
    assert d["FailureReason"].startswith(reason), d["FailureReason"]
    sm.delete_endpoint(EndpointName=name)
    assert_no_strays(stack)


def _serve_stack(tmp_path, tiny_llama_dir, **env: str) -> Stack:
    s = Stack(tmp_path, extra_env=env).start()
    upload(s, tiny_llama_dir, "s3://models/tiny/")
    return s


def test_no_endpoint_stays_in_transition_past_the_bound(tmp_path, tiny_llama_dir):
    """No worker consumes `serve` here: CreateEndpoint's task is never run. The train
    worker's watchdog ends the transition once it is older than the bound."""
    stack = _serve_stack(tmp_path, tiny_llama_dir, EAGLENEST_WORKER_QUEUES="train",
                         EAGLENEST_JOB_LEASE_SECONDS="3",
                         EAGLENEST_ENDPOINT_TRANSITION_SECONDS="6")
    try:
        sm = stack.client()
        make_endpoint(sm, "stuck", "s3://models/tiny/", serving_env())
        start = time.monotonic()
        d = wait_endpoint(sm, "stuck", {"Failed"}, 60, stack)
        assert 6 <= time.monotonic() - start + 1 < 20
        assert d["FailureReason"] == (
            "The endpoint stayed Creating longer than 6 s "
            "(EAGLENEST_ENDPOINT_TRANSITION_SECONDS); it was marked Failed.")
    finally:
        stack.stop()


def _invoke(rt, name: str, text: str) -> int:  # type: ignore[no-untyped-def]
    r = rt.invoke_endpoint(EndpointName=name, ContentType="application/json", Body=json.dumps(
        {"inputs": text, "parameters": {"max_new_tokens": 2, "temperature": 0}}))
    r["Body"].read()
    return int(r["ResponseMetadata"]["HTTPStatusCode"])


def _captured(stack: Stack, endpoint: str) -> list[dict]:
    root = stack.data_dir / "s3" / "capture" / "traffic" / endpoint
    return [json.loads(line) for p in sorted(root.rglob("*.jsonl"))
            for line in p.read_text().splitlines()]


def _instance(stack: Stack, endpoint: str) -> dict:
    return stack.deployment(endpoint)["Servers"]["AllTraffic"]["instances"][0]


def test_api_killed_loses_no_answered_capture_and_stale_records_are_not_signalled(
        tmp_path, tiny_llama_dir):
    # captures roll once a minute: without the spool, killing the API loses them all
    stack = _serve_stack(tmp_path, tiny_llama_dir)
    try:
        sm, rt = stack.client(), stack.client("sagemaker-runtime")
        make_endpoint(sm, "captured", "s3://models/tiny/", serving_env(), capture=True)
        wait_endpoint(sm, "captured", {"InService"}, 300, stack)
        answered = [_invoke(rt, "captured", f"prompt {i}") for i in range(20)]
        assert answered == [200] * 20
        killed = api_pid(stack)
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: api_pid(stack) not in (None, killed), 30, "up did not restart the API",
                 stack)
        wait_for(lambda: api_answers(stack), 60, "the restarted API does not answer", stack)
        records = wait_for(lambda: len(_captured(stack, "captured")) >= 20 and
                           _captured(stack, "captured"), 60, "capture lost", stack)
        assert sorted(r["prompt"] for r in records) == sorted(f"prompt {i}" for i in range(20))

        # DeleteEndpoint with a record that names another host: the process is not touched
        server = _instance(stack, "captured")
        db = Database(stack.database_url)
        try:
            with db.session() as s:
                row = s.query(EndpointRow).filter_by(name="captured").one()
                dep = json.loads(json.dumps(row.deployment))
                for inst in dep["Servers"]["AllTraffic"]["instances"]:
                    inst["child"]["host"] = "another-host"
                dep["Servers"]["AllTraffic"].update(dep["Servers"]["AllTraffic"]["instances"][0])
                row.deployment = dep
        finally:
            db.dispose()
        sm.delete_endpoint(EndpointName="captured")
        wait_for(lambda: not sm.list_endpoints(NameContains="captured")["Endpoints"], 60,
                 "the endpoint was not deleted", stack)
        assert server["pid"] in stack_processes(stack)  # not signalled
        assert "it runs on host another-host (boot" in stack.log()
        os.killpg(server["pid"], signal.SIGKILL)  # ours to clean up now
        assert_no_strays(stack)
    finally:
        stack.stop()
    # once `up` is gone, any process of its data dir was left behind
    wait_for(lambda: not stack_processes(stack), 20, "processes outlived the stack")
