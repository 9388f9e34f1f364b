"""The benchmark stage: baseline (target alone) vs speculative, same load, same backend."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglenest.foundation.instance_auth import new_secret
from eaglenest.foundation.processes import free_port
from eaglenest.workers.jobs.loadgen import BenchConfig, LevelResult, run, to_json, to_markdown
from eaglenest.workers.serving.process import ServerProcess, ServerSpec

log = logging.getLogger("eaglenest.optimize")


@dataclass
class BenchPlan:
    model_dir: Path
    head_dir: Path
    prompts: list[str]
    backend: str
    concurrency: tuple[int, ...]
    max_tokens: int
    num_speculative_tokens: int
    mode: str = "chain"
    startup_timeout: float = 900.0
    #: children registry (foundation/children.py) and the job the servers belong to
    registry: Path | None = None
    resource: str = ""


def _serve_and_measure(plan: BenchPlan, head: Path | None, log_path: Path,
                       should_stop: Any) -> list[LevelResult]:
    spec = ServerSpec(model_dir=plan.model_dir, served_name="bench", port=free_port(),
                      backend=plan.backend, head_dir=head, mode=plan.mode,
                      num_speculative_tokens=plan.num_speculative_tokens,
                      secret=new_secret())
    server = ServerProcess(spec, log_path, plan.registry, plan.resource, "benchmark-server")
    server.start(plan.startup_timeout)
    try:
        results = []
        for c in plan.concurrency:
            if should_stop():
                break
            cfg = BenchConfig(base_url=server.base_url, model="bench", prompts=plan.prompts,
                              api_key=spec.secret,
                              concurrencies=(c,), max_tokens=plan.max_tokens)
            results += asyncio.run(run(cfg))
        return results
    finally:
        server.stop()


def run_benchmark(plan: BenchPlan, out: Path, should_stop: Any) -> dict[str, Any]:
    rows = {
        "baseline": _serve_and_measure(plan, None, out / "logs" / "baseline-server.log",
                                       should_stop),
        "eagle": _serve_and_measure(plan, plan.head_dir, out / "logs" / "eagle-server.log",
                                    should_stop),
    }
    report = to_json(rows, backend=plan.backend, prompts=len(plan.prompts),
                     max_tokens=plan.max_tokens,
                     num_speculative_tokens=plan.num_speculative_tokens)
    report["speedup"] = {
        str(b.concurrency): e.output_throughput / b.output_throughput
        for b, e in zip(rows["baseline"], rows["eagle"], strict=False)
        if b.output_throughput > 0
    }
    (out / "benchmark.json").write_text(json.dumps(report, indent=1))
    md = f"Serving backend: **{plan.backend}**; K = {plan.num_speculative_tokens}; "
    md += f"{len(plan.prompts)} held-out prompts; {plan.max_tokens} tokens each.\n\n"
    (out / "benchmark.md").write_text(md + to_markdown(rows))
    plot(rows, out / "benchmark.png")
    return report


def plot(rows: dict[str, list[LevelResult]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for name, levels in rows.items():
        xs = [r.concurrency for r in levels]
        a.plot(xs, [r.output_throughput for r in levels], marker="o", label=name)
        b.plot(xs, [r.tpot_ms_p50 for r in levels], marker="o", label=name)
    a.set(xlabel="concurrency", ylabel="output tokens/s", title="Throughput")
    b.set(xlabel="concurrency", ylabel="TPOT p50 (ms)", title="Latency")
    for ax in (a, b):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
