"""CreateOptimizationJob end to end: a real stack (API, Celery worker, embedded Redis,
local artifact store), a tiny real target, built-in data, real training, a real benchmark
(embedded backend, baseline vs EAGLE), outputs published, output model registered."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.jobs import job, upload, wait_status
from tests.support.stack import ACCOUNT, Stack

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_llama_dir):
    s = Stack(tmp_path_factory.mktemp("pipeline")).start()
    upload(s, tiny_llama_dir, "s3://models/tiny-llama/")
    yield s
    s.stop()


def test_job_trains_benchmarks_and_publishes(stack):
    sm = stack.client()
    sm.create_optimization_job(OptimizationJobName="tiny-eagle3",
                               **job("s3://models/tiny-llama/", "optimized",
                                     EAGLENEST_PROGRESS_EVERY="2", EAGLENEST_BENCH_KS="1,3"))
    d = wait_status(sm, "tiny-eagle3", {"COMPLETED", "FAILED"})
    assert d["OptimizationJobStatus"] == "COMPLETED", d.get("FailureReason")
    assert d["OptimizationStartTime"] <= d["OptimizationEndTime"]
    progress = re.findall(r"INFO eaglenest.optimize job tiny-eagle3: (step \d+/4 \(\d+%\)  "
                          r"loss [\d.]+  train acc@[\d/]+ [\d./]+"
                          r"(?:  held-out acc@[\d/]+ [\d./]+(?: \(step \d+\))?)?"
                          r"  [\d,]+ tokens/s  ETA \w+) "
                          rf"\[job={ACCOUNT}/tiny-eagle3\]", stack.log())
    assert [p.split()[1] for p in progress] == ["2/4", "4/4"], stack.log()[-3000:]
    # the benchmark: a line per server start and per row measured (2 levels x 3 rows x 2
    # rounds), none per HTTP request
    bench_lines = re.findall(r"INFO eaglenest.optimize job tiny-eagle3: benchmark: (.*) "
                             rf"\[job={ACCOUNT}/tiny-eagle3\]", stack.log())
    assert len(bench_lines) == 3 + 12, stack.log()[-3000:]
    assert bench_lines[0] == "starting the baseline server (1/3, embedded)"
    assert re.fullmatch(r"concurrency 2 \(level 2/2\)  baseline \(embedded\)  round 2/2  "
                        r"[\d,.]+ tok/s  requests (\d+)/\1 \(100%\)  ETA 0s", bench_lines[-1])
    assert "HTTP Request" not in stack.log()
    # tqdm (transformers' "Loading weights" bar) goes through logging at INFO
    assert "celery.redirected" not in stack.log()
    assert re.search(rf"INFO eaglenest.stderr Loading weights: 100%.* "
                     rf"\[job={ACCOUNT}/tiny-eagle3\]$", stack.log(), re.M), stack.log()[-3000:]
    # the backend the job benchmarked on (tests/support/jobs.py: embedded), not a fixed vllm
    assert d["OptimizationOutput"] == {"RecommendedInferenceImage": "embedded"}
    out = stack.data_dir / "s3" / "output" / "jobs" / "tiny-eagle3"
    manifest = json.loads((out / "_MANIFEST.json").read_text())["files"]
    for f in ("eagle_model/config.json", "eagle_model/model.safetensors",
              "eagle_model/provenance.json", "eagle_model/speculation_schedule.json",
              "benchmark.json", "benchmark.md", "benchmark.png",
              "training_log.jsonl", "provenance.json"):
        assert f in manifest and (out / f).is_file(), f
    bench = json.loads((out / "benchmark.json").read_text())
    assert bench["backend"] == "embedded"
    assert list(bench["results"]) == ["baseline", "chain K=1", "chain K=3"]
    for name in bench["results"]:
        assert [r["concurrency"] for r in bench["results"][name]] == [1, 2]
        assert all(r["output_tokens"] > 0 for r in bench["results"][name])
    assert bench["results"]["chain K=3"][0]["acceptance_length"] >= 1.0
    # the schedule: per level (ascending) the K with the best mean tok/s among those that beat
    # the baseline by 5% in both rounds and are no deeper than the level below's, else 0; the
    # same thresholds in the channel file, the report and the model
    schedule = json.loads((out / "eagle_model" / "speculation_schedule.json").read_text())
    measured = schedule["measured"]
    rounds = measured["output_throughput_by_round"]
    assert measured["rounds"] == 2 and all(len(v) == 2 for r in rounds.values()
                                           for v in r.values())
    cap = 3
    for c, pick in sorted(measured["chosen"].items(), key=lambda x: int(x[0])):
        base = rounds["baseline"][c]
        wins = [kk for kk in (1, 3) if kk <= cap and all(
            e > 1.05 * b for e, b in zip(rounds[f"chain K={kk}"][c], base, strict=True))]
        expect = max(wins, key=lambda kk: sum(rounds[f"chain K={kk}"][c]), default=0)
        assert pick == (f"chain K={expect}" if expect else "off"), (c, pick, rounds)
        cap = expect
    assert schedule["thresholds"] == bench["schedule"]["thresholds"]
    assert schedule["thresholds"][-1][0] == 2 and measured["ks"] == [1, 3]
    md = (out / "benchmark.md").read_text()
    assert "| chain K=1 | 1 |" in md and "| chain K=3 | 2 |" in md
    assert "Speculation schedule: **" in md
    assert (out / "benchmark.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    log_lines = [json.loads(x) for x in (out / "training_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log_lines] == [1, 2, 3, 4]
    assert all(x["ts"].endswith("Z") and x["tokens"] > 0 for x in log_lines)
    head_cfg = json.loads((out / "eagle_model" / "config.json").read_text())
    assert head_cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    model = sm.describe_model(ModelName="optimized")
    env = model["PrimaryContainer"]["Environment"]
    assert json.loads(env["EAGLENEST_SPECULATION_SCHEDULE"]) == schedule["thresholds"]
    assert env["EAGLENEST_SERVING_BACKEND"] == "embedded"
    assert env["EAGLENEST_DECODE_MODE"] == "chain"  # the EAGLE-3 kind's default mode
    assert model["PrimaryContainer"]["Image"] == "embedded"  # ModelSource.S3: the backend
    extra = model["PrimaryContainer"]["AdditionalModelDataSources"]
    assert extra == [{"ChannelName": "eagle_model", "S3DataSource": {
        "S3Uri": "s3://output/jobs/tiny-eagle3/eagle_model/", "S3DataType": "S3Prefix",
        "CompressionType": "None"}}]
    assert not (stack.data_dir / "jobs" / ACCOUNT / "tiny-eagle3").exists()  # work dir cleaned


def _step_losses(stack: Stack, name: str) -> list[float]:
    log = stack.data_dir / "s3" / "output" / "jobs" / name / "training_log.jsonl"
    return [json.loads(x)["loss"] for x in log.read_text().splitlines()]


def test_bring_your_own_eagle_trains_further(stack):
    """SageMaker's second path: the source model carries a trained head as the
    `eagle_model` channel (here: the output model of the first job); the job starts from
    that head instead of a fresh one."""
    sm = stack.client()
    if not sm.list_models(NameContains="optimized")["Models"]:
        sm.create_optimization_job(OptimizationJobName="tiny-eagle3",
                                   **job("s3://models/tiny-llama/", "optimized"))
        wait_status(sm, "tiny-eagle3", {"COMPLETED"})
    args = job("s3://models/tiny-llama/")
    args["ModelSource"] = {"SageMakerModel": {"ModelName": "optimized"}}
    args["OutputConfig"] = {"S3OutputLocation": "s3://output/jobs/"}
    sm.create_optimization_job(OptimizationJobName="byo-eagle", **args)
    d = wait_status(sm, "byo-eagle", {"COMPLETED", "FAILED"})
    assert d["OptimizationJobStatus"] == "COMPLETED", d.get("FailureReason")
    out = stack.data_dir / "s3" / "output" / "jobs" / "byo-eagle"
    prov = json.loads((out / "eagle_model" / "provenance.json").read_text())
    assert prov["train_config"]["init_head"], prov["train_config"]
    # Same data order and seed as the first job: step 1 sees the same batch, so a head
    # that starts trained starts with a lower loss than the first job's fresh head did.
    first, again = _step_losses(stack, "tiny-eagle3"), _step_losses(stack, "byo-eagle")
    assert again[0] < first[0], (first, again)
    # the wrong head kind for the channel's head fails with a reason, not a crash
    args["OptimizationEnvironment"] = {**args["OptimizationEnvironment"],
                                       "EAGLENEST_HEAD": "eagle"}
    sm.create_optimization_job(OptimizationJobName="byo-wrong-kind", **args)
    d = wait_status(sm, "byo-wrong-kind", {"COMPLETED", "FAILED"})
    assert d["OptimizationJobStatus"] == "FAILED"
    assert "holds a eagle3 head, not eagle" in d["FailureReason"], d["FailureReason"]


def _status(stack: Stack) -> str:
    r = subprocess.run([sys.executable, "-m", "eaglenest.cli", "status"],
                       env=stack.env(), capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_default_job_regenerates_and_trains_to_its_time_budget(stack):
    """Without the test pins (tests/support/jobs.py), a job regenerates every assistant turn,
    the held-out ones included, and its time budget, not the step cap, ends training."""
    args = job("s3://models/tiny-llama/", EAGLENEST_MAX_STEPS="100000",
               EAGLENEST_MAX_TRAIN_MINUTES="0.1", EAGLENEST_PROGRESS_EVERY="5",
               EAGLENEST_BENCHMARK="0")
    for pinned in ("EAGLENEST_REGENERATE", "EAGLENEST_PLATEAU_EVALS"):
        del args["OptimizationEnvironment"][pinned]
    sm = stack.client()
    sm.create_optimization_job(OptimizationJobName="defaults", **args)
    d = wait_status(sm, "defaults", {"COMPLETED", "FAILED"})
    assert d["OptimizationJobStatus"] == "COMPLETED", d.get("FailureReason")
    turns = sum(1 for line in (ROOT / "models/data/builtin/gsm8k_training.jsonl").open()
                for m in json.loads(line)["messages"] if m["role"] == "assistant")
    assert f"job defaults: regenerated {turns}/{turns} assistant turns" in stack.log()
    prov = json.loads((stack.data_dir / "s3" / "output" / "jobs" / "defaults"
                       / "provenance.json").read_text())
    assert prov["options"]["regenerate"] is True and prov["options"]["plateau_evals"] == 4
    assert prov["train"]["stop_reason"] == "time budget", prov["train"]
    assert 0 < prov["train"]["steps"] < 100000
    lines = re.findall(r"job defaults: step \d+ \((\d+)% of 6s\)  loss .*  ETA (\w+) ",
                       stack.log())
    assert lines and all(0 <= int(p) <= 100 for p, _ in lines), stack.log()[-3000:]


def test_stop_during_training(stack):
    """A training job's progress shows in `eaglenest status` and its training_log.jsonl grows
    under the output prefix while it runs (DescribeOptimizationJob stays SageMaker's shape)."""
    sm = stack.client()
    sm.create_optimization_job(OptimizationJobName="to-stop", **job(
        "s3://models/tiny-llama/", EAGLENEST_MAX_STEPS="100000", EAGLENEST_PROGRESS_EVERY="1"))
    wait_status(sm, "to-stop", {"INPROGRESS"})
    published = stack.data_dir / "s3" / "output" / "jobs" / "to-stop" / "training_log.jsonl"
    deadline = time.monotonic() + 120
    while not published.exists() or len(published.read_text().splitlines()) < 2:
        assert time.monotonic() < deadline, stack.log()[-3000:]
        time.sleep(0.5)
    steps = [json.loads(x)["step"] for x in published.read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1))
    status = _status(stack)
    running = re.search(r"^  to-stop +INPROGRESS .*\n    train eagle3 head on \d+ samples: "
                        r"step (\d+)/100000 \(0%\)  loss [\d.]+  train acc@[\d/]+ [\d./]+  "
                        # a held-out evaluation shows once one ran (every EVAL_EVERY steps)
                        r"(?:held-out acc@[\d/]+ [\d./]+ \(step \d+\)  )?"
                        r"[\d,]+ tokens/s  ETA \w+  \(updated \w+ ago\)$", status, re.M)
    assert running and int(running.group(1)) >= 2, status
    d = sm.describe_optimization_job(OptimizationJobName="to-stop")
    assert d["OptimizationJobStatus"] == "INPROGRESS"
    assert not [k for k in d if "progress" in k.lower() or k in ("Stage", "Step")], d
    sm.stop_optimization_job(OptimizationJobName="to-stop")
    assert sm.describe_optimization_job(
        OptimizationJobName="to-stop")["OptimizationJobStatus"] in ("STOPPING", "STOPPED")
    d = wait_status(sm, "to-stop", {"STOPPED", "FAILED", "COMPLETED"}, timeout=60)
    assert d["OptimizationJobStatus"] == "STOPPED"


def test_job_trains_in_two_data_parallel_processes(stack):
    """EAGLENEST_TRAIN_PROCESSES=2: the training stage runs under torchrun (2 gloo ranks on
    the CPU); the job's outputs are the same as in one process."""
    sm = stack.client()
    args = job("s3://models/tiny-llama/", EAGLENEST_TRAIN_PROCESSES="2",
               EAGLENEST_BENCHMARK="0", EAGLENEST_CHECKPOINT_EVERY="2")
    args["DeploymentInstanceType"] = "ml.g5.12xlarge"  # 2 ranks need a type of >= 2 GPUs
    sm.create_optimization_job(OptimizationJobName="tiny-ddp", **args)
    d = wait_status(sm, "tiny-ddp", {"COMPLETED", "FAILED"})
    assert d["OptimizationJobStatus"] == "COMPLETED", d.get("FailureReason")
    assert "job tiny-ddp: train in 2 data-parallel processes (torchrun)" in stack.log()
    assert "job tiny-ddp: step 4/4 (100%)  loss " in stack.log()  # rows from rank 0
    out = stack.data_dir / "s3" / "output" / "jobs" / "tiny-ddp"
    log = [json.loads(x)["step"] for x in (out / "training_log.jsonl").read_text().splitlines()]
    assert log == [1, 2, 3, 4]
    assert json.loads((out / "eagle_model" / "provenance.json").read_text())["steps"] == 4


def test_stop_reaches_data_parallel_processes(stack):
    sm = stack.client()
    args = job("s3://models/tiny-llama/", EAGLENEST_TRAIN_PROCESSES="2",
               EAGLENEST_MAX_STEPS="100000")
    args["DeploymentInstanceType"] = "ml.g5.12xlarge"  # 2 ranks need a type of >= 2 GPUs
    sm.create_optimization_job(OptimizationJobName="ddp-stop", **args)
    wait_status(sm, "ddp-stop", {"INPROGRESS"})
    ranks_log = stack.data_dir / "jobs" / ACCOUNT / "ddp-stop" / "ddp" / "ranks.log"
    deadline = time.monotonic() + 120
    while not ranks_log.exists():
        assert time.monotonic() < deadline, stack.log()[-3000:]
        time.sleep(0.2)
    time.sleep(3)
    sm.stop_optimization_job(OptimizationJobName="ddp-stop")
    d = wait_status(sm, "ddp-stop", {"STOPPED", "FAILED", "COMPLETED"}, timeout=90)
    assert d["OptimizationJobStatus"] == "STOPPED", d.get("FailureReason")


def test_max_runtime_is_enforced(stack):
    sm = stack.client()
    args = job("s3://models/tiny-llama/", EAGLENEST_MAX_STEPS="100000")
    args["StoppingCondition"] = {"MaxRuntimeInSeconds": 5}
    sm.create_optimization_job(OptimizationJobName="too-long", **args)
    d = wait_status(sm, "too-long", {"FAILED", "COMPLETED", "STOPPED"}, timeout=120)
    assert d["OptimizationJobStatus"] == "FAILED"
    assert d["FailureReason"] == ("The job ran longer than StoppingCondition."
                                  "MaxRuntimeInSeconds (5 s) and was stopped.")


def test_missing_model_files_fail_clearly(stack, tiny_llama_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama_dir, broken)
    (broken / "tokenizer.json").unlink()
    (broken / "generation_config.json").unlink()
    upload(stack, broken, "s3://models/broken/")
    sm = stack.client()
    sm.create_optimization_job(OptimizationJobName="broken", **job("s3://models/broken/"))
    d = wait_status(sm, "broken", {"FAILED", "COMPLETED"})
    assert d["OptimizationJobStatus"] == "FAILED"
    assert "missing required files" in d["FailureReason"]
    assert "tokenizer.json" in d["FailureReason"]
    assert "generation_config.json" in d["FailureReason"]


def test_bad_dataset_line_fails_with_file_and_line(stack, tmp_path):
    data = tmp_path / "train.jsonl"
    good = json.dumps({"prompt": "1+1=", "completion": " 2"})
    data.write_text("\n".join([good] * 5 + ["{not json"] + [good] * 5) + "\n")
    upload(stack, data, "s3://data/bad/train.jsonl")
    sm = stack.client()
    args = job("s3://models/tiny-llama/")
    args["OptimizationConfigs"] = [{"ModelSpeculativeDecodingConfig": {
        "Technique": "EAGLE", "TrainingDataSource": {"S3Uri": "s3://data/bad/",
                                                     "S3DataType": "S3Prefix"}}}]
    sm.create_optimization_job(OptimizationJobName="bad-data", **args)
    d = wait_status(sm, "bad-data", {"FAILED", "COMPLETED"})
    assert d["OptimizationJobStatus"] == "FAILED"
    assert "train.jsonl:6" in d["FailureReason"]


def test_bad_option_fails_naming_the_variable(stack):
    sm = stack.client()
    sm.create_optimization_job(OptimizationJobName="bad-option", **job(
        "s3://models/tiny-llama/", EAGLENEST_HEAD="medusa"))
    d = wait_status(sm, "bad-option", {"FAILED", "COMPLETED"})
    from eaglenest.models.heads.registry import KINDS

    assert d["FailureReason"] == f"EAGLENEST_HEAD='medusa' must be one of {', '.join(KINDS)}"
    assert KINDS[:3] == ("eagle", "eagle3", "peagle")


def test_unsupported_architecture(stack, tiny_llama_dir, tmp_path):
    other = tmp_path / "gpt2ish"
    shutil.copytree(tiny_llama_dir, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (other / "config.json").write_text(json.dumps(cfg))
    upload(stack, other, "s3://models/gpt2ish/")
    sm = stack.client()
    sm.create_optimization_job(OptimizationJobName="arch", **job("s3://models/gpt2ish/"))
    d = wait_status(sm, "arch", {"FAILED", "COMPLETED"})
    assert d["OptimizationJobStatus"] == "FAILED"
    assert "GPT2LMHeadModel" in d["FailureReason"]
    assert "LlamaForCausalLM" in d["FailureReason"]  # the message lists what is supported


def test_unknown_builtin_dataset_and_empty_dataset(stack, tmp_path):
    sm = stack.client()
    sm.create_optimization_job(OptimizationJobName="no-such-data", **job(
        "s3://models/tiny-llama/", EAGLENEST_DATASET="wikipedia.jsonl"))
    d = wait_status(sm, "no-such-data", {"FAILED", "COMPLETED"})
    assert d["FailureReason"].startswith("EAGLENEST_DATASET: unknown built-in dataset")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    upload(stack, empty, "s3://data/empty/empty.jsonl")
    args = job("s3://models/tiny-llama/")
    args["OptimizationConfigs"] = [{"ModelSpeculativeDecodingConfig": {
        "Technique": "EAGLE", "TrainingDataSource": {"S3Uri": "s3://data/empty/",
                                                     "S3DataType": "S3Prefix"}}}]
    sm.create_optimization_job(OptimizationJobName="empty-data", **args)
    d = wait_status(sm, "empty-data", {"FAILED", "COMPLETED"})
    assert d["OptimizationJobStatus"] == "FAILED"
    assert "empty.jsonl" in d["FailureReason"]
    args["OptimizationConfigs"][0]["ModelSpeculativeDecodingConfig"]["TrainingDataSource"][
        "S3Uri"] = "s3://data/nothing-here/"
    sm.create_optimization_job(OptimizationJobName="no-files", **args)
    d = wait_status(sm, "no-files", {"FAILED", "COMPLETED"})
    assert d["FailureReason"] == "TrainingDataSource: nothing found at s3://data/nothing-here/"


def test_bench_cli(tiny_llama_dir, tiny_eagle3_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Natalia sold 48 clips\ndef add(a, b):\n")
    r = subprocess.run(
        [sys.executable, "-m", "eaglenest.cli", "bench", "--target", str(tiny_llama_dir),
         "--head", str(tiny_eagle3_dir), "--out", str(tmp_path / "out"), "--prompts",
         str(prompts), "--concurrency", "1", "--max-tokens", "8", "--backend", "embedded",
         "--num-speculative-tokens", "3", "--data-dir", str(tmp_path / "data"),
         "--decodings", "chain", "--max-rounds", "2"],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| baseline | 1 |" in r.stdout and "| chain K=3 | 1 |" in r.stdout
    report = json.loads((tmp_path / "out" / "benchmark.json").read_text())
    assert report["backend"] == "embedded" and "1" in report["speedup"]
    schedule = json.loads((tmp_path / "out" / "speculation_schedule.json").read_text())
    assert schedule["thresholds"] == report["schedule"]["thresholds"]
    assert f"speculation schedule: {json.dumps(schedule['thresholds'])}" in r.stdout
