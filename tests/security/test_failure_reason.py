"""A model server that cannot start fails its endpoint with the cause in one line (issue #51):
DescribeEndpoint's FailureReason names the architecture the server refused, never a
traceback, a path of the host (the stack's data dir, the venv) or an account id."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from tests.security.conftest import ROLE, container, deploy
from tests.support.jobs import upload
from tests.support.stack import Stack


def test_an_unknown_architecture_fails_in_one_line(secure: Stack, tiny_llama_dir: Path,
                                                    tmp_path: Path) -> None:
    bad = tmp_path / "bad-arch"
    shutil.copytree(tiny_llama_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    config["architectures"] = ["NoSuchForCausalLM"]
    (bad / "config.json").write_text(json.dumps(config))
    upload(secure, bad, "s3://models/bad-arch/")
    sm = secure.client()
    sm.create_model(ModelName="bad-arch", ExecutionRoleArn=ROLE,
                    PrimaryContainer=container(uri="s3://models/bad-arch/"))
    deploy(sm, "bad-arch", "bad-arch")
    deadline = time.monotonic() + 120
    d = sm.describe_endpoint(EndpointName="bad-arch")
    while d["EndpointStatus"] == "Creating" and time.monotonic() < deadline:
        time.sleep(0.5)
        d = sm.describe_endpoint(EndpointName="bad-arch")
    reason = d.get("FailureReason", "")
    assert d["EndpointStatus"] == "Failed", d
    assert "NoSuchForCausalLM" in reason, reason
    assert "\n" not in reason and "Traceback" not in reason and 'File "' not in reason, reason
    assert str(secure.data_dir) not in reason and ".venv" not in reason, reason
    assert "/work/" not in reason and "site-packages" not in reason, reason
    sm.delete_endpoint(EndpointName="bad-arch")
