"""Container Environment -> serving process options (workers/serving/deploy.py): the values
a user can set on CreateModel, and the FailureReason a bad one gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglenest.workers.serving.deploy import DeployError, VariantPlan, _spec
from eaglenest.workers.serving.process import EMBEDDED


def plan(**env: str) -> VariantPlan:
    return VariantPlan("AllTraffic", "m", 1.0, 1, 60, "s3://models/m/", "s3://models/h/",
                       {"EAGLENEST_SERVING_BACKEND": "embedded", **env})


def test_adaptive_reaches_the_embedded_server() -> None:
    spec = _spec(plan(EAGLENEST_ADAPTIVE="1", EAGLENEST_DECODE_MODE="tree"), Path("/m"),
                 Path("/h"), "ep")
    assert spec.backend == EMBEDDED and spec.adaptive and spec.mode == "tree"
    cmd = spec.command()
    assert "--adaptive" in cmd and cmd[cmd.index("--mode") + 1] == "tree"
    off = _spec(plan(), Path("/m"), Path("/h"), "ep")
    assert not off.adaptive and "--adaptive" not in off.command()
    # without a head there is nothing to adapt: the flag is not passed
    assert "--adaptive" not in _spec(plan(EAGLENEST_ADAPTIVE="1"), Path("/m"), None,
                                     "ep").command()


@pytest.mark.parametrize(("env", "message"), [
    ({"EAGLENEST_ADAPTIVE": "yes"}, "EAGLENEST_ADAPTIVE='yes' must be 0 or 1"),
    ({"EAGLENEST_DECODE_MODE": "beam"}, "EAGLENEST_DECODE_MODE='beam' must be chain, tree or"),
    ({"EAGLENEST_NUM_SPECULATIVE_TOKENS": "0"}, "EAGLENEST_NUM_SPECULATIVE_TOKENS='0' must be"),
    ({"EAGLENEST_MAX_MODEL_LEN": "abc"}, "EAGLENEST_MAX_MODEL_LEN='abc' must be a positive"),
])
def test_bad_values_name_the_variable_and_the_constraint(env: dict[str, str],
                                                         message: str) -> None:
    with pytest.raises(DeployError, match=message.replace("(", r"\(")):
        _spec(plan(**env), Path("/m"), Path("/h"), "ep")


def test_adaptive_needs_the_embedded_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    import eaglenest.workers.serving.deploy as deploy

    monkeypatch.setattr(deploy, "default_backend", lambda: "vllm")  # as if vLLM were installed
    with pytest.raises(DeployError, match="EAGLENEST_ADAPTIVE=1 needs "
                                          "EAGLENEST_SERVING_BACKEND=embedded"):
        _spec(plan(EAGLENEST_ADAPTIVE="1", EAGLENEST_SERVING_BACKEND="vllm"), Path("/m"),
              Path("/h"), "ep")
