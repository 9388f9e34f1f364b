"""Shared fixtures: the running stack and boto3 clients (see tests/support/stack.py), and the
tiny Llama target folder."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.stack import ACCESS_KEY, REGION, SECRET_KEY, Stack


@pytest.fixture(scope="session", autouse=True)
def compute_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The suite's own registry of compute processes (foundation/host/threads.py): thread shares
    in tests count the suite's model servers, not those of whatever else runs on the host."""
    import os

    root = tmp_path_factory.mktemp("compute-registry")
    old = os.environ.get("EAGLENEST_COMPUTE_REGISTRY")
    os.environ["EAGLENEST_COMPUTE_REGISTRY"] = str(root)
    yield root
    if old is None:
        os.environ.pop("EAGLENEST_COMPUTE_REGISTRY", None)
    else:
        os.environ["EAGLENEST_COMPUTE_REGISTRY"] = old


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # The API suite runs the API and broker only: tasks queue up in Redis and states stay
    # where the API put them. Worker behaviour is tested in tests/workers with full stacks.
    s = Stack(tmp_path_factory.mktemp("stack"), extra_env={"EAGLENEST_WORKER_QUEUES": ""})
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random LlamaForCausalLM model folder (eaglenest.models.tiny), built once per
    session; shared by tests/workers and tests/integration."""
    from eaglenest.models.tiny import build_tiny_target

    return build_tiny_target(tmp_path_factory.mktemp("tiny") / "llama", "LlamaForCausalLM")


@pytest.fixture(scope="session")
def sm(stack: Stack):  # type: ignore[no-untyped-def]
    return stack.client()


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> str:
    """A name unique to this test (tests share one stack)."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40].strip("-")
    return f"{base}-{int(time.time() * 1000) % 10**8}"


@pytest.fixture(scope="session")
def signed_post(stack: Stack):  # type: ignore[no-untyped-def]
    """POST / with a raw body and target, signed with SigV4 like botocore would."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    # One client for the session: httpx.post builds a new client (and SSL context) per
    # call, about 50 ms, which the fuzz suite (tests/api/test_fuzz.py) cannot afford.
    http = httpx.Client(timeout=30)

    def post(target: str, body: bytes) -> httpx.Response:
        req = AWSRequest(method="POST", url=f"{stack.url}/", data=body, headers={
            "X-Amz-Target": target, "Content-Type": "application/x-amz-json-1.1"})
        SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "sagemaker", REGION).add_auth(req)
        return http.post(req.url, content=body, headers=dict(req.headers.items()))

    yield post
    http.close()
