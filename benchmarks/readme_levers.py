"""The README's training levers, measured on its own data and budget: one optimization job
per lever on one `eaglenest up`, each trained as the README's job 1 is (its data, its
OPTIONS, EAGLENEST_MAX_TRAIN_MINUTES from --minutes) with one option changed, each
benchmarked the same way (chain K=3 against the baseline at concurrency 1, its two rows
interleaved round by round).

    python -m benchmarks.readme_levers [--target DIR] [--minutes 8] [--only NAME,...]
                                       [--out FILE.md] [--list]

The levers (LEVERS): the README's job as it stands, one sampled regenerated answer per
training example beside the greedy one (EAGLENEST_REGENERATE_SAMPLES=1), shorter samples
(EAGLENEST_MAX_LENGTH), a shallower and a deeper training-time test (EAGLENEST_TTT_STEPS),
three smaller and a larger draft vocabulary (EAGLENEST_DRAFT_VOCAB_SIZE); then the README's
job 3 (built-in datasets, 3 minutes) from scratch and from the first lever's head. Every job
writes to one S3OutputLocation, so the greedy answers are regenerated once and reused (the
regeneration cache; the sampled pass once too); each job's minutes are still printed.

Per lever it prints the training (steps, minutes, why it stopped, held-out acc@1/2/3 at its
last evaluation), the benchmark (tok/s of both rows, their ratio and its pooled spread, tau)
and the job's wall time; a lever's difference is worth reading only beside the spread and
the noise of one training run (the budget is wall-clock: a busy box trains fewer steps).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.user_stack import UserStack

ROOT = Path(__file__).resolve().parents[1]
ROLE = "arn:aws:iam::000000000000:role/EagleNest"
DEFAULT_TARGET = Path.home() / ".cache" / "eaglenest" / "smollm2-135m-instruct"
#: the benchmark every lever gets: one decoding at one K against the baseline, at one level,
#: on the backend the README's install serves with (its service lock has no vLLM)
BENCH = {"EAGLENEST_BENCH_CONCURRENCY": "1", "EAGLENEST_BENCH_DECODINGS": "chain",
         "EAGLENEST_BENCH_KS": "3", "EAGLENEST_SERVING_BACKEND": "embedded"}
ROW = "chain K=3"
#: name -> (job options over the README's, the job's data: "mine" (train.jsonl) or
#: "builtin", the lever whose head the job starts from or None)
LEVERS: dict[str, tuple[dict[str, str], str, str | None]] = {
    "readme": ({}, "mine", None),
    "sampled answers": ({"EAGLENEST_REGENERATE_SAMPLES": "1"}, "mine", None),
    "length 512": ({"EAGLENEST_MAX_LENGTH": "512"}, "mine", None),
    "ttt 2": ({"EAGLENEST_TTT_STEPS": "2"}, "mine", None),
    "ttt 4": ({"EAGLENEST_TTT_STEPS": "4"}, "mine", None),
    "vocab 1024": ({"EAGLENEST_DRAFT_VOCAB_SIZE": "1024"}, "mine", None),
    "vocab 2048": ({"EAGLENEST_DRAFT_VOCAB_SIZE": "2048"}, "mine", None),
    "vocab 4096": ({"EAGLENEST_DRAFT_VOCAB_SIZE": "4096"}, "mine", None),
    "vocab 16384": ({"EAGLENEST_DRAFT_VOCAB_SIZE": "16384"}, "mine", None),
    "job 3 from scratch": ({"EAGLENEST_MAX_TRAIN_MINUTES": "3"}, "builtin", None),
    "job 3 from readme": ({"EAGLENEST_MAX_TRAIN_MINUTES": "3"}, "builtin", "readme"),
}
SMOLLM2 = {"S3DataSource": {"S3Uri": "s3://models/smollm2/", "S3DataType": "S3Prefix",
                            "CompressionType": "None"}}


def job_name(lever: str) -> str:
    """"job 3 from readme" -> "lever-job-3-from-readme"."""
    return "lever-" + lever.replace(" ", "-")


def readme_options(text: str | None = None) -> dict[str, str]:
    """The job options the README's walkthrough gives every job (its ``OPTIONS = {...}``
    at the start of a line, README.md unless ``text``)."""
    text = (ROOT / "README.md").read_text() if text is None else text
    start = text.index("\nOPTIONS = {") + len("\nOPTIONS = ")
    options = ast.literal_eval(text[start:text.index("}", start) + 1])  # may span lines
    return {str(k): str(v) for k, v in options.items()}


def run_job(sm: Any, lever: str, minutes: float) -> dict[str, Any]:
    """One lever's job to its end (module docstring); its DescribeOptimizationJob."""
    options, data, start = LEVERS[lever]
    model = "smollm2"
    if start is not None:
        head = sm.describe_model(ModelName=f"{job_name(start)}-model")[
            "PrimaryContainer"]["AdditionalModelDataSources"]
        model = f"{job_name(lever)}-start"
        sm.create_model(ModelName=model, ExecutionRoleArn=ROLE, PrimaryContainer={
            "Image": "vllm", "ModelDataSource": SMOLLM2, "AdditionalModelDataSources": head})
    config: dict[str, Any] = {"Technique": "EAGLE"}
    if data == "mine":
        config["TrainingDataSource"] = {"S3Uri": "s3://data/train/", "S3DataType": "S3Prefix"}
    env = {**readme_options(), "EAGLENEST_MAX_TRAIN_MINUTES": f"{minutes:g}", **BENCH,
           **options}
    name = job_name(lever)
    sm.create_optimization_job(
        OptimizationJobName=name, RoleArn=ROLE, DeploymentInstanceType="ml.g5.2xlarge",
        ModelSource={"SageMakerModel": {"ModelName": model}}, OptimizationEnvironment=env,
        OptimizationConfigs=[{"ModelSpeculativeDecodingConfig": config}],
        OutputConfig={"S3OutputLocation": "s3://output/",
                      "SageMakerModel": {"ModelName": f"{name}-model"}},
        StoppingCondition={"MaxRuntimeInSeconds": 36000})
    while True:
        d = sm.describe_optimization_job(OptimizationJobName=name)
        if d["OptimizationJobStatus"] in ("COMPLETED", "FAILED", "STOPPED"):
            return dict(d)
        time.sleep(5)


def figures(s3: Any, lever: str, described: dict[str, Any]) -> dict[str, Any]:
    """A finished lever job's row (module docstring), from its provenance.json and
    benchmark.json."""
    name = job_name(lever)

    def read(key: str) -> Any:
        return json.loads(s3.get_object(Bucket="output", Key=f"{name}/{key}")["Body"].read())

    train = read("provenance.json")["train"]
    measured = (report := read("benchmark.json"))["schedule"]["measured"]
    rates = measured["output_throughput"]
    tau = [r["acceptance_length"] for r in report["results"][ROW] if r["concurrency"] == 1]
    took = described["OptimizationEndTime"] - described["OptimizationStartTime"]
    return {"lever": lever, "options": LEVERS[lever][0], "steps": train["steps"],
            "train_minutes": train["seconds"] / 60, "stop": train["stop_reason"],
            "heldout": train["heldout_accuracy"][:3], "baseline": rates["baseline"]["1"],
            "row": rates[ROW]["1"], "ratio": rates[ROW]["1"] / rates["baseline"]["1"],
            "spread": measured["pooled_spread"][ROW]["1"],
            "tau": tau[0] if tau else None, "job_minutes": took.total_seconds() / 60}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| lever | options | steps | train min | stopped | held-out acc@1/2/3 | tau K=3 "
             f"| baseline tok/s | {ROW} tok/s | ratio (spread) | job min |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = " / ".join(f"{a:.3f}" for a in r["heldout"]) or "-"
        opts = ", ".join(f"{k.removeprefix('EAGLENEST_')}={v}" for k, v in r["options"].items())
        tau = f"{r['tau']:.2f}" if r["tau"] else "-"
        lines.append(f"| {r['lever']} | {opts or '-'} | {r['steps']} | {r['train_minutes']:.1f} "
                     f"| {r['stop']} | {acc} | {tau} | {r['baseline']:.1f} | {r['row']:.1f} "
                     f"| {r['ratio']:.2f}x ({100 * r['spread']:.1f}%) | "
                     f"{r['job_minutes']:.1f} |")
    return "\n".join(lines) + "\n"


def prepare(stack: UserStack, target: Path, work: Path) -> Any:
    """The README's first steps: the target and train.jsonl uploaded, model "smollm2"."""
    train = work / "train.jsonl"
    train.write_bytes(b"".join(p.read_bytes() for p in
                               sorted((ROOT / "models" / "data" / "builtin").glob("*.jsonl"))))
    for src, dest in ((target, "s3://models/smollm2/"), (train, "s3://data/train/train.jsonl")):
        subprocess.run([sys.executable, "-m", "eaglenest.cli", "s3", "cp", str(src), dest],
                       env=stack.env(), check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    sm = stack.client()
    sm.create_model(ModelName="smollm2", ExecutionRoleArn=ROLE,
                    PrimaryContainer={"Image": "vllm", "ModelDataSource": SMOLLM2})
    return sm


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--target", type=Path, default=DEFAULT_TARGET)
    p.add_argument("--minutes", type=float, default=8.0, help="job 1's training minutes")
    p.add_argument("--only", default="", help="comma-separated lever names (default: all)")
    p.add_argument("--out", type=Path, default=None, help="also write the table here")
    p.add_argument("--list", action="store_true", help="print the levers and exit")
    args = p.parse_args(argv)
    if args.list:
        for name, (options, data, start) in LEVERS.items():
            print(f"{name}: {options} on {data}" + (f", from {start}'s head" if start else ""))
        return 0
    chosen = [n.strip() for n in args.only.split(",") if n.strip()] or list(LEVERS)
    unknown = [n for n in chosen if n not in LEVERS]
    if unknown:
        p.error(f"unknown levers {unknown}; --list shows them")
    starts = {s for n in chosen if (s := LEVERS[n][2]) is not None} - set(chosen)
    if starts:
        p.error(f"{sorted(starts)} must run first (a lever starts from its head): add them")
    work = Path(tempfile.mkdtemp(prefix="eaglenest-levers-"))
    stack = UserStack(work / "data").start()
    rows: list[dict[str, Any]] = []
    try:
        sm = prepare(stack, args.target, work)
        s3 = stack.client("s3")
        for lever in chosen:
            print(f"{time.strftime('%H:%M:%S')} {lever}: {LEVERS[lever][0]}", flush=True)
            d = run_job(sm, lever, args.minutes)
            if d["OptimizationJobStatus"] != "COMPLETED":
                print(f"{lever}: {d['OptimizationJobStatus']} {d.get('FailureReason', '')}")
                return 1
            rows.append(figures(s3, lever, d))
            print(table(rows[-1:]), flush=True)
    finally:
        stack.stop()
    text = table(rows)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
