"""Container Environment -> serving process options (workers/serving/deploy.py): the values
a user can set on CreateModel, and the FailureReason a bad one gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglenest.workers.model_servers.process import EMBEDDED
from eaglenest.workers.serving.deploy import DeployError, VariantPlan, _spec


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
    ({"EAGLENEST_DECODE_MODE": "beam"}, "EAGLENEST_DECODE_MODE='beam' must be chain, tree, parallel or"),
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


def _head(tmp_path: Path, schedule: str | None = None) -> Path:
    head = tmp_path / "head"
    head.mkdir(parents=True, exist_ok=True)
    (head / "config.json").write_text('{"architectures": ["Eagle3Speculator"]}')
    if schedule is not None:
        (head / "speculation_schedule.json").write_text(
            '{"thresholds": ' + schedule + ', "measured": {}}')
    return head


def _arg(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def test_the_channel_schedule_reaches_the_embedded_server(tmp_path: Path) -> None:
    head = _head(tmp_path, "[[1, 5], [4, 3], [16, 0]]")
    cmd = _spec(plan(), Path("/m"), head, "ep").command()
    assert _arg(cmd, "--speculation-schedule") == "[[1,5],[4,3],[16,0]]"
    assert _arg(cmd, "--num-speculative-tokens") == "5"  # the schedule's largest K
    # the Environment entry wins over the file; "none" or an explicit K means a fixed K
    cmd = _spec(plan(EAGLENEST_SPECULATION_SCHEDULE="[[2,3],[8,1]]"), Path("/m"), head,
                "ep").command()
    assert _arg(cmd, "--speculation-schedule") == "[[2,3],[8,1]]"
    for env in ({"EAGLENEST_SPECULATION_SCHEDULE": "none"},
                {"EAGLENEST_NUM_SPECULATIVE_TOKENS": "4"}):
        cmd = _spec(plan(**env), Path("/m"), head, "ep").command()
        assert _arg(cmd, "--speculation-schedule") is None and _arg(cmd, "--head") == str(head)
    # a schedule that is off at every load serves the target alone
    cmd = _spec(plan(), Path("/m"), _head(tmp_path / "off", "[[16, 0]]"), "ep").command()
    assert "--head" not in cmd and "--speculation-schedule" not in cmd


def test_scheduled_decodings_reach_the_embedded_server(tmp_path: Path) -> None:
    """A schedule naming decodings, from the channel file or the Environment entry, reaches
    the embedded server's command line as written; the endpoint's served K stays K only."""
    from eaglenest.workers.serving.deploy import served_k

    head = _head(tmp_path, '[[1, 3, "tree"], [8, 2, "chain"]]')
    spec = _spec(plan(), Path("/m"), head, "ep")
    assert _arg(spec.command(), "--speculation-schedule") == '[[1,3,"tree"],[8,2,"chain"]]'
    assert served_k(spec) == [[1, 3], [8, 2]]
    raw = '[[1,4,"tree+adaptive"],[4,2,"chain"],[16,0]]'
    cmd = _spec(plan(EAGLENEST_SPECULATION_SCHEDULE=raw), Path("/m"), head, "ep").command()
    assert _arg(cmd, "--speculation-schedule") == raw
    assert _arg(cmd, "--num-speculative-tokens") == "4"


def test_decodings_the_head_cannot_run_fail_the_endpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    import eaglenest.workers.model_servers.process as process
    import eaglenest.workers.serving.deploy as deploy

    head = _head(tmp_path)  # an EAGLE-3 head: no mask slots, no blocks
    with pytest.raises(DeployError) as exc:
        _spec(plan(EAGLENEST_SPECULATION_SCHEDULE='[[1,3,"tree"],[4,3,"parallel"]]'),
              Path("/m"), head, "ep")
    assert str(exc.value) == (
        "Variant AllTraffic: the speculation schedule's decoding 'parallel' does not suit the "
        "head: parallel drafting needs a head with mask slots (HeadSpec.parallel); EAGLE-3 "
        "heads have none")
    with pytest.raises(DeployError) as exc:
        _spec(plan(EAGLENEST_SPECULATION_SCHEDULE='[[1,3,"beam"]]'), Path("/m"), head, "ep")
    assert str(exc.value).startswith("EAGLENEST_SPECULATION_SCHEDULE: [1, 3, \"beam\"] names an "
                                     "unknown decoding 'beam'; valid: chain, chain+adaptive, ")
    # vLLM drafts its own method at each K: the decodings are noted, not refused
    monkeypatch.setattr(deploy, "default_backend", lambda: "vllm")
    monkeypatch.setattr(process, "cuda_available", lambda: False)
    monkeypatch.setattr(process, "vllm_dynamic_speculation", lambda: True)
    with caplog.at_level(logging.INFO, logger="eaglenest.endpoints"):
        spec = _spec(plan(EAGLENEST_SERVING_BACKEND="vllm", EAGLENEST_SPLIT_SERVING="0",
                          EAGLENEST_SPECULATION_SCHEDULE='[[1,3,"parallel"],[8,2]]'),
                     Path("/m"), head, "ep")
    assert spec.schedule_refusal() is None
    assert ("variant AllTraffic: vLLM drafts with the head's own method at the schedule's K; "
            "the decodings it names (parallel) are the embedded engine's") in caplog.messages
    config = json.loads(_arg(spec.command(), "--speculative-config") or "{}")
    assert config["method"] == "eagle3"
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 4096, 2]]


def test_bad_schedules_fail_the_endpoint_naming_the_source(tmp_path: Path) -> None:
    with pytest.raises(DeployError) as exc:
        _spec(plan(EAGLENEST_SPECULATION_SCHEDULE="[[4,3],[2,1]]"), Path("/m"),
              _head(tmp_path), "ep")
    assert str(exc.value) == ("EAGLENEST_SPECULATION_SCHEDULE: max_running must increase from "
                              "entry to entry (4 then 2)")
    with pytest.raises(DeployError) as exc:
        _spec(plan(), Path("/m"), _head(tmp_path / "bad", "[[1, -1]]"), "ep")
    assert str(exc.value) == ("speculation_schedule.json: [1, -1] needs max_running >= 1 and "
                              "0 <= K <= 64")
    with pytest.raises(DeployError) as exc:
        _spec(plan(EAGLENEST_EXPECTED_CONCURRENCY="0"), Path("/m"), _head(tmp_path), "ep")
    assert str(exc.value) == "EAGLENEST_EXPECTED_CONCURRENCY='0' must be 1..4096"


def test_vllm_gets_the_schedule_as_its_dynamic_speculation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    import eaglenest.workers.model_servers.process as process
    import eaglenest.workers.serving.deploy as deploy

    monkeypatch.setattr(deploy, "default_backend", lambda: "vllm")
    monkeypatch.setattr(process, "cuda_available", lambda: False)
    head = _head(tmp_path, "[[1, 5], [4, 3], [16, 0]]")
    vllm_plan = plan(EAGLENEST_SERVING_BACKEND="vllm", EAGLENEST_SPLIT_SERVING="0")
    monkeypatch.setattr(process, "vllm_dynamic_speculation", lambda: True)
    config = json.loads(_arg(_spec(vllm_plan, Path("/m"), head, "ep").command(),
                             "--speculative-config") or "{}")
    assert config == {"method": "eagle3", "model": str(head), "num_speculative_tokens": 5,
                      "num_speculative_tokens_per_batch_size": [[1, 1, 5], [2, 4, 3],
                                                                [5, 4096, 0]]}
    # a vLLM without dynamic speculation: the schedule's K at the expected load, fixed
    monkeypatch.setattr(process, "vllm_dynamic_speculation", lambda: False)
    for load, k in (("1", 5), ("3", 3)):
        cmd = _spec(plan(EAGLENEST_SERVING_BACKEND="vllm", EAGLENEST_EXPECTED_CONCURRENCY=load),
                    Path("/m"), head, "ep").command()
        config = json.loads(_arg(cmd, "--speculative-config") or "{}")
        assert config["num_speculative_tokens"] == k
        assert "num_speculative_tokens_per_batch_size" not in config
    cmd = _spec(plan(EAGLENEST_SERVING_BACKEND="vllm", EAGLENEST_EXPECTED_CONCURRENCY="8"),
                Path("/m"), head, "ep").command()
    assert "--speculative-config" not in cmd  # off at that load: the target alone


def test_vllm_splits_where_the_schedule_turns_off(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Off above 4 running: the split router with a speculating and a plain vLLM server
    (workers/model_servers/split_router.py), both on loopback; EAGLENEST_SPLIT_SERVING=0: one server."""
    import json

    import eaglenest.workers.model_servers.process as process
    import eaglenest.workers.serving.deploy as deploy

    monkeypatch.setattr(deploy, "default_backend", lambda: "vllm")
    monkeypatch.setattr(process, "cuda_available", lambda: False)
    monkeypatch.setattr(process, "vllm_dynamic_speculation", lambda: True)
    head = _head(tmp_path, "[[1, 5], [4, 3], [16, 0]]")
    spec = _spec(plan(EAGLENEST_SERVING_BACKEND="vllm"), Path("/m"), head, "ep")
    spec.bind_host = "0.0.0.0"
    cmd = spec.command()
    assert cmd[1:3] == ["-m", "eaglenest.workers.model_servers.split_router"]
    assert (_arg(cmd, "--speculate-upto"), _arg(cmd, "--port"), _arg(cmd, "--host")) == (
        "4", str(spec.port), "0.0.0.0")
    fast = json.loads(_arg(cmd, "--speculative-command") or "[]")
    plain = json.loads(_arg(cmd, "--plain-command") or "[]")
    assert _arg(fast, "--host") == _arg(plain, "--host") == "127.0.0.1"
    assert json.loads(_arg(fast, "--speculative-config") or "{}")[
        "num_speculative_tokens_per_batch_size"] == [[1, 1, 5], [2, 4, 3], [5, 4096, 0]]
    assert "--speculative-config" not in plain
    assert [a for a in plain if a != "--speculative-config"] == [
        a for a in fast if a not in ("--speculative-config", _arg(fast, "--speculative-config"))]
    assert "--speculative-config" in _spec(
        plan(EAGLENEST_SERVING_BACKEND="vllm", EAGLENEST_SPLIT_SERVING="0"), Path("/m"), head,
        "ep").command()
    # on at every load: nothing to split
    on = _head(tmp_path / "on", "[[1, 5], [4, 3]]")
    assert "--speculative-config" in _spec(plan(EAGLENEST_SERVING_BACKEND="vllm"), Path("/m"),
                                           on, "ep").command()
    with pytest.raises(DeployError, match="EAGLENEST_SPLIT_SERVING='yes' must be 0 or 1"):
        _spec(plan(EAGLENEST_SPLIT_SERVING="yes"), Path("/m"), head, "ep")


@pytest.mark.parametrize(("env", "max_len"), [
    ({}, 2048),
    ({"MAX_TOTAL_TOKENS": "4096"}, 4096),  # TGI: prompt + generated tokens
    ({"MAX_TOTAL_TOKENS": "4096", "OPTION_MAX_MODEL_LEN": "3000"}, 3000),
    ({"MAX_TOTAL_TOKENS": "4096", "OPTION_MAX_MODEL_LEN": "3000",
      "EAGLENEST_MAX_MODEL_LEN": "1000", "MAX_INPUT_LENGTH": "999"}, 1000),
])
def test_max_model_len_precedence(env: dict[str, str], max_len: int) -> None:
    assert _spec(plan(**env), Path("/m"), Path("/h"), "ep").max_model_len == max_len


@pytest.mark.parametrize(("env", "message"), [
    ({"MAX_TOTAL_TOKENS": "0"}, "MAX_TOTAL_TOKENS='0' must be a positive integer"),
    ({"OPTION_MAX_MODEL_LEN": "x"}, "OPTION_MAX_MODEL_LEN='x' must be a positive integer"),
    ({"MAX_TOTAL_TOKENS": "1024", "MAX_INPUT_LENGTH": "1024"},
     "MAX_INPUT_LENGTH='1024' must be a positive integer below the max model length, 1024 "
     "(MAX_TOTAL_TOKENS)"),
    ({"MAX_INPUT_LENGTH": "0"}, "MAX_INPUT_LENGTH='0' must be a positive integer below the "
                                "max model length, 2048 (EAGLENEST_MAX_MODEL_LEN)"),
])
def test_bad_lengths_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(DeployError) as exc:
        _spec(plan(**env), Path("/m"), Path("/h"), "ep")
    assert str(exc.value) == message


def test_ignored_variables_reach_no_server_and_are_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """HF_TOKEN and the like pass Create and deploy; the server's environment leaves them
    out (foundation/environment.py) and the worker names them once per variant."""
    import logging

    from eaglenest.db.session import Database
    from eaglenest.db.tables import Base, EndpointConfigRow, ModelRow
    from eaglenest.workers.serving.deploy import plan_variants

    env = {"EAGLENEST_SERVING_BACKEND": "embedded", "HF_TOKEN": "hf_x", "HF_MODEL_ID": "o/m",
           "SM_NUM_GPUS": "1"}
    spec = _spec(plan(**env), Path("/m"), Path("/h"), "ep")
    child = spec.env()
    assert child["SM_NUM_GPUS"] == "1" and "HF_TOKEN" not in child
    assert "HF_MODEL_ID" not in child
    db = Database("sqlite://")
    Base.metadata.create_all(db.engine)
    container = {"Image": "x", "Environment": env, "ModelDataUrl": "s3://models/m/"}
    with db.session() as s:
        s.add(ModelRow(name="m", name_key="m", account_id="1" * 12, arn="arn:m",
                       creation_time=0.0, spec={"ModelName": "m", "PrimaryContainer": container}))
        s.add(EndpointConfigRow(name="c", name_key="c", account_id="1" * 12, arn="arn:c",
                                creation_time=0.0, spec={"EndpointConfigName": "c",
                                "ProductionVariants": [{"VariantName": "v", "ModelName": "m",
                                                        "InstanceType": "ml.g5.2xlarge"}]}))
        s.flush()
        with caplog.at_level(logging.WARNING, "eaglenest.endpoints"):
            (variant,) = plan_variants(s, "1" * 12, "c")
    assert variant.env == env  # the request as stored: nothing dropped before the server
    assert [r.getMessage() for r in caplog.records] == [
        "variant v of endpoint config c ignores Environment variables HF_MODEL_ID, HF_TOKEN "
        "of model m: EagleNest does not pass them to the model server or any process it "
        "starts (docs/security.md)"]
