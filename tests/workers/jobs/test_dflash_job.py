"""A DFlash optimization job end to end (issue #53): a real stack (API, Celery worker,
embedded Redis, local artifact store), the tiny real target, built-in data, real training of
a block head, a real benchmark of its block mode at each K, outputs published, the output
model registered, served by an endpoint in block mode, and answering through boto3
InvokeEndpoint exactly as the target alone does (greedy decoding is lossless)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.support.jobs import ROLE, job, upload, wait_status
from tests.support.stack import Stack

#: the block head kind (models/heads/registry.py HeadSpec.block)
BLOCK = "dflash"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_llama_dir):
    s = Stack(tmp_path_factory.mktemp("dflash-job")).start()
    upload(s, tiny_llama_dir, "s3://models/tiny-llama/")
    yield s
    s.stop()


def _endpoint(sm, name: str, model: str) -> None:
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": model, "InstanceType": "ml.g5.2xlarge",
        "InitialInstanceCount": 1, "ContainerStartupHealthCheckTimeoutInSeconds": 120}])


def _in_service(sm, name: str) -> dict:
    sm.get_waiter("endpoint_in_service").wait(
        EndpointName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 180})
    return sm.describe_endpoint(EndpointName=name)


def _generate(rt, name: str, text: str) -> str:
    r = rt.invoke_endpoint(EndpointName=name, ContentType="application/json", Body=json.dumps(
        {"inputs": text, "parameters": {"max_new_tokens": 16, "temperature": 0}}))
    assert r["InvokedProductionVariant"] == "AllTraffic"
    return str(json.loads(r["Body"].read())["generated_text"])


def _server(stack: Stack, name: str) -> dict:
    """The endpoint's model server as its deployment records it (url, pid, secret)."""
    from eaglenest.db.session import Database
    from eaglenest.db.tables import EndpointRow

    db = Database(stack.database_url)
    try:
        with db.session() as s:
            row = s.query(EndpointRow).filter_by(name=name).one()
            return dict(row.deployment["Servers"]["AllTraffic"])
    finally:
        db.dispose()


def _server_command(stack: Stack, name: str) -> list[str]:
    """The command line of the endpoint's model server process."""
    pid = int(_server(stack, name)["pid"])
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def _spec_counters(stack: Stack, name: str) -> dict[str, float]:
    """The endpoint's server's spec-decode counters (its /metrics, with its secret)."""
    from eaglenest.workers.model_servers.embedded.metrics import parse_spec_counters

    server = _server(stack, name)
    r = httpx.get(f"{server['url']}/metrics", timeout=10,
                  headers={"Authorization": f"Bearer {server['secret']}"})
    r.raise_for_status()
    return parse_spec_counters(r.text)


def _option(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_a_dflash_job_completes_and_its_endpoint_answers(stack: Stack) -> None:
    sm, rt = stack.client(), stack.client("sagemaker-runtime")
    args = job("s3://models/tiny-llama/", "tiny-dflash", EAGLENEST_HEAD=BLOCK,
               EAGLENEST_DFLASH_BLOCK_SIZE="4", EAGLENEST_DFLASH_LAYERS="1",
               EAGLENEST_DFLASH_GAMMA="4",
               # a draft vocabulary below the target's, as on real targets (d2t / t2d)
               EAGLENEST_DRAFT_VOCAB_SIZE="64")
    for pinned in ("EAGLENEST_BENCH_KS", "EAGLENEST_NUM_SPECULATIVE_TOKENS"):
        del args["OptimizationEnvironment"][pinned]  # K and the rows follow the block size
    args["OptimizationEnvironment"]["EAGLENEST_BENCH_DECODINGS"] = "block"  # block mode only
    sm.create_optimization_job(OptimizationJobName="tiny-dflash", **args)
    d = wait_status(sm, "tiny-dflash", {"COMPLETED", "FAILED"}, timeout=600, stack=stack)
    assert d["OptimizationJobStatus"] == "COMPLETED", d.get("FailureReason")
    out = stack.data_dir / "s3" / "output" / "jobs" / "tiny-dflash"
    head_cfg = json.loads((out / "eagle_model" / "config.json").read_text())
    assert head_cfg["architectures"] == ["DFlashDraftModel"]
    assert head_cfg["dflash_config"]["block_size"] == 4 and head_cfg["num_hidden_layers"] == 1
    prov = json.loads((out / "eagle_model" / "provenance.json").read_text())
    train = prov["train_config"]
    assert (train["head"], train["dflash_block_size"], train["dflash_layers"],
            train["dflash_gamma"], train["speculative_tokens"]) == (BLOCK, 4, 1, 4.0, 3)
    # the benchmark: block mode at K = 1, 3 (capped by block_size - 1 = 3), both rounds
    bench = json.loads((out / "benchmark.json").read_text())
    assert list(bench["results"]) == ["baseline", "block K=1", "block K=3"]
    assert bench["results"]["block K=3"][0]["acceptance_length"] >= 1.0
    schedule = json.loads((out / "eagle_model" / "speculation_schedule.json").read_text())
    assert schedule["mode"] == "block" and schedule["measured"]["ks"] == [1, 3]
    assert schedule["thresholds"] == bench["schedule"]["thresholds"]
    model = sm.describe_model(ModelName="tiny-dflash")
    env = model["PrimaryContainer"]["Environment"]
    assert env["EAGLENEST_DECODE_MODE"] == "block"
    assert json.loads(env["EAGLENEST_SPECULATION_SCHEDULE"]) == schedule["thresholds"]
    # served: the output model as the job registered it (its schedule may be off at every
    # load for a head trained 4 steps: then the target alone answers) ...
    prompts = ["Natalia sold 48 clips in April", "def add(a, b):"]
    _endpoint(sm, "cfg-dflash", "tiny-dflash")
    sm.create_endpoint(EndpointName="ep-dflash", EndpointConfigName="cfg-dflash")
    _in_service(sm, "ep-dflash")
    as_made = [_generate(rt, "ep-dflash", p) for p in prompts]
    assert all(as_made), as_made
    # ... the same head at a fixed K = 3, drafting a block every round ...
    container = {k: v for k, v in model["PrimaryContainer"].items()
                 if k in ("Image", "ModelDataSource", "AdditionalModelDataSources")}
    container["Environment"] = {**env, "EAGLENEST_SPECULATION_SCHEDULE": "none",
                                "EAGLENEST_NUM_SPECULATIVE_TOKENS": "3"}
    sm.create_model(ModelName="tiny-dflash-k3", ExecutionRoleArn=ROLE,
                    PrimaryContainer=container)
    _endpoint(sm, "cfg-dflash-k3", "tiny-dflash-k3")
    sm.update_endpoint(EndpointName="ep-dflash", EndpointConfigName="cfg-dflash-k3")
    assert _in_service(sm, "ep-dflash")["EndpointConfigName"] == "cfg-dflash-k3"
    cmd = _server_command(stack, "ep-dflash")
    assert (_option(cmd, "--mode"), _option(cmd, "--num-speculative-tokens")) == ("block", "3")
    assert _option(cmd, "--head") and "--speculation-schedule" not in cmd
    drafted = [_generate(rt, "ep-dflash", p) for p in prompts]
    counters = _spec_counters(stack, "ep-dflash")
    assert counters["drafts"] > 0 and counters["draft_tokens"] >= 3 * counters["drafts"] - 3, (
        counters)  # 3 drafts a round (fewer only where a request nears its token limit)
    # ... and the target alone: greedy speculative decoding is lossless
    sm.create_model(ModelName="tiny-target", ExecutionRoleArn=ROLE, PrimaryContainer={
        "Image": "embedded", "Environment": {"EAGLENEST_SERVING_BACKEND": "embedded"},
        "ModelDataSource": {"S3DataSource": {"S3Uri": "s3://models/tiny-llama/",
                                             "S3DataType": "S3Prefix",
                                             "CompressionType": "None"}}})
    _endpoint(sm, "cfg-target", "tiny-target")
    sm.update_endpoint(EndpointName="ep-dflash", EndpointConfigName="cfg-target")
    assert _in_service(sm, "ep-dflash")["EndpointConfigName"] == "cfg-target"
    assert "--head" not in _server_command(stack, "ep-dflash")
    assert [_generate(rt, "ep-dflash", p) for p in prompts] == drafted == as_made
    sm.delete_endpoint(EndpointName="ep-dflash")


def _public_head(tiny_llama_dir: Path, folder: Path) -> Path:
    """A DFlash head in the public layout (no lm_head, no d2t; tests/models/heads/
    test_dflash.py ``public_checkpoint``) that fuses other target layers than EagleNest's
    default ones: the outputs of layers 0 and 3 (aux layers [1, 4])."""
    from eaglenest.models.data.template import Chat, encode_examples
    from eaglenest.models.heads.registry import HEADS
    from eaglenest.models.target import load_target
    from eaglenest.models.training.config import TrainConfig
    from tests.models.heads.test_dflash import public_checkpoint

    target = load_target(tiny_llama_dir, aux_layer_ids=[1, 4])
    samples = encode_examples([Chat([{"role": "user", "content": "What is 2+2?"},
                                     {"role": "assistant", "content": "2+2 is 4. " * 6}])],
                              target.tokenizer, 128)
    config = TrainConfig(head=BLOCK, draft_vocab_size=target.vocab_size, dflash_layers=1,
                         dflash_block_size=16)
    head = HEADS[BLOCK].build(target, samples, config).eval()
    return public_checkpoint(head, folder, target.num_layers)  # type: ignore[arg-type]


def test_a_dflash_job_starts_from_a_public_head_over_other_layers(
        stack: Stack, tiny_llama_dir: Path, tmp_path: Path) -> None:
    """SageMaker's second path with a public DFlash head as the `eagle_model` channel: the
    job's target captures the layers that head reads (its dflash_config.target_layer_ids),
    trains it further in its own block and publishes it reading the same layers."""
    sm = stack.client()
    upload(stack, _public_head(tiny_llama_dir, tmp_path / "public"), "s3://models/public-dflash/")
    sm.create_model(ModelName="tiny-public-dflash", ExecutionRoleArn=ROLE, PrimaryContainer={
        "Image": "embedded", "Environment": {"EAGLENEST_SERVING_BACKEND": "embedded"},
        "ModelDataSource": {"S3DataSource": {
            "S3Uri": "s3://models/tiny-llama/", "S3DataType": "S3Prefix",
            "CompressionType": "None"}},
        "AdditionalModelDataSources": [{"ChannelName": "eagle_model", "S3DataSource": {
            "S3Uri": "s3://models/public-dflash/", "S3DataType": "S3Prefix",
            "CompressionType": "None"}}]})
    args = job("s3://models/tiny-llama/", EAGLENEST_HEAD=BLOCK, EAGLENEST_BENCHMARK="0",
               EAGLENEST_BENCH_DECODINGS="block")  # checked even with no benchmark
    for pinned in ("EAGLENEST_BENCH_KS", "EAGLENEST_NUM_SPECULATIVE_TOKENS"):
        del args["OptimizationEnvironment"][pinned]
    args["ModelSource"] = {"SageMakerModel": {"ModelName": "tiny-public-dflash"}}
    sm.create_optimization_job(OptimizationJobName="public-dflash", **args)
    d = wait_status(sm, "public-dflash", {"COMPLETED", "FAILED"}, timeout=600, stack=stack)
    assert d["OptimizationJobStatus"] == "COMPLETED", d.get("FailureReason")
    out = stack.data_dir / "s3" / "output" / "jobs" / "public-dflash" / "eagle_model"
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["train_config"]["init_head"], prov["train_config"]
    head_cfg = json.loads((out / "config.json").read_text())
    assert head_cfg["dflash_config"]["target_layer_ids"] == [0, 3]  # aux [1, 4], as started
    # no EAGLENEST_DFLASH_BLOCK_SIZE: the started head's block, and K = min(7, 16 - 1)
    assert head_cfg["dflash_config"]["block_size"] == 16 and head_cfg["num_hidden_layers"] == 1
    train = prov["train_config"]
    assert (train["dflash_block_size"], train["speculative_tokens"]) == (16, 7)
