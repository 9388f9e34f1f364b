"""Run the GPU check: ``python -m benchmarks.gpu_check [--device cuda|cpu] [--tiny] [--out DIR]``
or ``bash scripts/gpu_check.sh ...`` (the sections: see the package docstring; ``--race-target
DIR`` adds the head race on that real target, benchmarks/gpu_check/race.py). Writes
gpu_check.json and gpu_check.md after every section and prints the markdown at the end.
Exit status 1 if the fp32 lossless check failed or a section raised; sections skipped for
the time budget (--budget-s) do not fail the run."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check import CEILING_FORMULA, measure, race, service
from benchmarks.gpu_check.build import SPECS, Bench, log, set_exact_fp32
from benchmarks.gpu_check.report import markdown

ROOT = Path(__file__).resolve().parents[2]

SECTIONS: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "training": measure.training,
    "lossless": measure.lossless,
    "verify_cost": measure.verify_cost,
    "throughput": measure.throughput,
    # EagleNest itself: up, a job on the GPU, an endpoint on it (benchmarks/gpu_check/service.py)
    "service": service.section,
}
#: fp32 first, then bf16; the service last (it frees the check's own model first)
RUN_ORDER = ("lossless", "verify_cost", "throughput", "training", "service")
#: targets the service section runs on (the 8B one adds time, not coverage)
SERVICE_MODELS = ("tiny", "1b")
#: the race's sizes with --tiny (seconds on a CPU: the code path, not a measurement)
TINY_RACE: dict[str, Any] = dict(minutes=0.05, regen_tokens=12, eval_tokens=12, limit=4,
                                 prompts=2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true",
                   help="the tiny test target instead of the 1B / 8B ones (seconds on a CPU)")
    p.add_argument("--models", default="1b,8b", help="comma list of 1b, 8b (ignored with --tiny)")
    p.add_argument("--sections", default=",".join(SECTIONS), help="comma list of sections")
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out",
                   help="output folder (default: $OUT if set, else ./gpu_check_out)")
    p.add_argument("--budget-s", type=float, default=330.0,
                   help="start no section after this many seconds (the rest are 'skipped')")
    p.add_argument("--race-target", type=Path, default=None,
                   help="a real target's Hugging Face folder: train an EAGLE-3 and a P-EAGLE head "
                        "on it for --race-minutes each and decode with both (section 'race')")
    p.add_argument("--race-minutes", type=float, default=3.0, help="training minutes per head")
    wheels = ROOT / ".gpu-wheels"
    p.add_argument("--wheels", type=Path, default=wheels if wheels.is_dir() else None,
                   help="the service's wheels for this Python (scripts/gpu_wheels.sh; default "
                        ".gpu-wheels when present, else this interpreter's packages)")
    args = p.parse_args(argv)
    bad = [m for m in _names(args.models) if m not in SPECS or m == "tiny"]
    bad += [s for s in _names(args.sections) if s not in SECTIONS]
    if bad:
        p.error(f"unknown model or section: {', '.join(bad)}")
    return args


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def environment(device: torch.device) -> dict[str, Any]:
    import transformers

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "device": str(device),
            "device_name": name or platform.machine(), "cuda": torch.version.cuda,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:]}


class Run:
    """The results document, written to disk after every section."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.budget = args.budget_s
        self.t0 = time.perf_counter()
        self.doc: dict[str, Any] = {"environment": environment(device), "formula":
                                    CEILING_FORMULA, "sections": {s: {} for s in SECTIONS}}

    def save(self) -> None:
        """gpu_check.json and gpu_check.md as they stand (a run cut short keeps its results)."""
        self.doc["total_seconds"] = time.perf_counter() - self.t0
        for name, text in (("gpu_check.json", json.dumps(self.doc, indent=2, default=str)),
                           ("gpu_check.md", markdown(self.doc))):
            tmp = self.out / f"{name}.tmp"
            tmp.write_text(text)
            tmp.replace(self.out / name)

    def section(self, name: str, model: str, compute: Callable[[], dict[str, Any]]) -> None:
        started = time.perf_counter()
        elapsed = started - self.t0
        if elapsed > self.budget:
            log(f"{model} {name}: skipped ({elapsed:.0f}s > budget {self.budget:.0f}s)")
            self.doc["sections"].setdefault(name, {})[model] = {
                "status": "skipped", "seconds": 0.0,
                "reason": f"time budget: started {elapsed:.0f}s > --budget-s {self.budget:.0f}"}
            self.save()
            return
        log(f"{model} {name}: start")
        try:
            entry = {"status": "ok", **compute()}
        except Exception as exc:  # recorded; the other sections still run
            traceback.print_exc()
            entry = {"status": "error", "error": f"{type(exc).__name__}: {exc}",
                     "traceback": traceback.format_exc(limit=8)}
        entry["seconds"] = time.perf_counter() - started
        self.doc["sections"].setdefault(name, {})[model] = entry
        log(f"{model} {name}: {entry['status']} in {entry['seconds']:.1f}s")
        self.save()

    def verdict(self) -> tuple[bool, list[str]]:
        problems = []
        for name, per_model in self.doc["sections"].items():
            for model, entry in per_model.items():
                if entry["status"] == "error":
                    problems.append(f"{model} {name}: {entry['error']}")
                if name == "lossless" and entry.get("fp32_lossless") is False:
                    problems.append(f"{model} lossless: fp32 greedy output differs from HF")
                for row in entry.get("rows", []) if name == "race" else []:
                    if row["equal_to_plain"] != entry["prompts"]:
                        problems.append(f"{model} race: {row['name']} output differs from plain")
                endpoint = entry.get("endpoint", {}) if name == "service" else {}
                for key in ("on_gpu_per_nvidia_smi", "gone_after_delete"):
                    if endpoint.get(key) is False:
                        problems.append(f"{model} service: {key} is false")
        return not problems, problems


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    set_exact_fp32()
    if args.tiny and device.type == "cpu":
        # tiny shapes: a second thread only adds pool hand-offs (a 32-wide bf16 linear takes
        # ms instead of us with two threads on a busy 2-core host)
        torch.set_num_threads(1)
    run = Run(args, device)
    env = run.doc["environment"]
    log(f"torch {env['torch']} transformers {env['transformers']} python {env['python']} "
        f"on {env['device']} ({env['device_name']}); out: {run.out}")
    models = ["tiny"] if args.tiny else _names(args.models)
    wanted = set(_names(args.sections))
    for model in models:
        bench = Bench(SPECS[model], device, out=run.out, wheels=args.wheels)
        for name in (s for s in RUN_ORDER if s in wanted):
            if name == "service":
                bench.close()  # the service loads the target itself
                if model not in SERVICE_MODELS:
                    continue
            run.section(name, model, partial(SECTIONS[name], bench))
        bench.close()
    if args.race_target is not None:
        cfg = race.RaceConfig(args.race_target, device, args.race_minutes)
        cfg = replace(cfg, **TINY_RACE) if args.tiny else cfg
        run.section("race", args.race_target.name, partial(race.section, cfg))
    ok, problems = run.verdict()
    run.doc["ok"], run.doc["problems"] = ok, problems
    run.save()
    print(markdown(run.doc), flush=True)
    log(f"{'OK' if ok else 'FAILED'} in {run.doc['total_seconds']:.1f}s; "
        f"wrote {run.out / 'gpu_check.json'} and {run.out / 'gpu_check.md'}")
    for p in problems:
        log(f"problem: {p}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
