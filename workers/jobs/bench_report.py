"""The benchmark stage's table and plot (workers/jobs/bench_stage.py run_benchmark writes
them as benchmark.md and benchmark.png): one column and one curve per row (baseline, then
each "decoding K=n" row), the schedule's choice per concurrency bold in the table and
ringed on the plot, each row's spread between rounds (workers/jobs/bench_rows.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from eaglenest.models.decode.kernels import LOG_PREFIX
from eaglenest.workers.jobs.bench_rows import BASELINE, SPREAD, pooled_spread, spread
from eaglenest.workers.jobs.loadgen import LevelResult, to_markdown
from eaglenest.workers.model_servers.schedule import MARGIN, Schedule

if TYPE_CHECKING:
    from eaglenest.workers.jobs.bench_stage import BenchPlan


def _rates(levels: list[LevelResult]) -> dict[int, float]:
    return {r.concurrency: r.output_throughput for r in levels}


def describe(schedule: Schedule) -> str:
    """Example: [[1, 4, "tree"], [4, 3, "chain"], [16, 0]] -> "tree K=4 at 1 running, chain
    K=3 at 2-4, off from 5"; an entry without a decoding (the server's own): "K=5"."""
    def what(k: int, decoding: str | None) -> str:
        return "off" if not k else f"{decoding} K={k}" if decoding else f"K={k}"

    if len(schedule.thresholds) == 1:
        return f"{what(*schedule.thresholds[0][1:])} at every load"
    parts, start = [], 1
    for i, (max_running, k, decoding) in enumerate(schedule.thresholds):
        last = i == len(schedule.thresholds) - 1
        span = (f"from {start}" if last else
                f"at {start}" if start == max_running else f"at {start}-{max_running}")
        parts.append(f"{what(k, decoding)} {span}" + (" running" if i == 0 else ""))
        start = max_running + 1
    return ", ".join(parts)


def server_kernels(logs: Path, stems: dict[str, str]) -> dict[str, str]:
    """Row name -> the linear kernels its server chose (the last such line of its log, e.g.
    "layers=onednn (measured; ms/round: stock 40.41, onednn 19.50), lm_head=onednn ...");
    a row whose log has none (a vLLM server) is left out. Rows compare fairly only where
    they ran the target's linears alike: this is how a reader checks."""
    out = {}
    for name, stem in stems.items():
        try:
            text = (logs / f"{stem}.log").read_text(errors="replace")
        except FileNotFoundError:
            continue
        found = [line.split(LOG_PREFIX, 1)[1] for line in text.splitlines()
                 if LOG_PREFIX in line]
        if found:
            out[name] = found[-1].strip()
    return out


def markdown(plan: BenchPlan, rows: dict[str, list[LevelResult]],
             by_round: dict[str, dict[int, list[float]]], schedule: Schedule,
             chosen: dict[int, str], kernels: dict[str, str] | None = None) -> str:
    """The table: one column per row (pooled tok/s, the chosen cell bold), the chosen row,
    the level's rounds and the chosen row's spread and pooled spread; then every row's
    spread between rounds; then each row's linear kernels (``kernels``, server_kernels);
    then loadgen's table per row and level."""
    names = [BASELINE, *(r.name for r in plan.rows)]
    ks = ", ".join(str(k) for k in plan.measured_ks)
    md = (f"Serving backend: **{plan.backend}**; decodings: "
          f"{', '.join(plan.decodings or (str(plan.mode),))}; K measured: {ks}; "
          f"{len(plan.prompts)} held-out prompts, each once a round; {plan.max_tokens} "
          f"tokens each.\n\n"
          f"Speculation schedule: **{describe(schedule)}** (`{schedule.to_env()}`: at each "
          f"concurrency the row with the highest output tok/s among those that beat the "
          f"baseline by more than {MARGIN:.0%} in every round, never deeper than the level "
          f"below's K; once off, off above). Figures: all rounds pooled. Spread: (max - min) "
          f"/ mean of a row's per-round tok/s; pooled: twice the standard error of their "
          f"mean over the mean (the spread itself with 2 rounds). At least {plan.rounds} "
          f"rounds a level, more (up to {max(plan.rounds, plan.max_rounds)}) while the "
          f"leading row's, the baseline's or the fastest row's pooled spread is "
          f"{SPREAD:.0%} or more.\n\n")
    lines = ["| concurrency | " + " | ".join(f"{n} tok/s" for n in names)
             + " | chosen | rounds | chosen's spread (pooled) |",
             "|" + "---|" * (len(names) + 4)]
    rates = {name: _rates(levels) for name, levels in rows.items()}
    for c, pick in chosen.items():
        row = BASELINE if pick == "off" else pick
        cells = [f"**{rates[n].get(c, 0):.1f}**" if n == row else f"{rates[n].get(c, 0):.1f}"
                 for n in names]
        lines.append(f"| {c} | " + " | ".join(cells) + f" | {pick} | "
                     f"{len(by_round[BASELINE].get(c, []))} | "
                     f"{spread(by_round[row].get(c, [])):.1%} "
                     f"({pooled_spread(by_round[row].get(c, [])):.1%}) |")
    lines += ["", "| spread between rounds | " + " | ".join(names) + " |",
              "|" + "---|" * (len(names) + 1)]
    for c in chosen:
        lines.append(f"| concurrency {c} | " + " | ".join(
            f"{spread(by_round[n].get(c, [])):.1%}" for n in names) + " |")
    if kernels:
        lines += ["", "| row | linear kernels (its server's choice) |", "|---|---|"]
        lines += [f"| {n} | {kernels[n]} |" for n in names if n in kernels]
    return md + "\n".join(lines) + "\n\n" + to_markdown(rows)


def plot(rows: dict[str, list[LevelResult]], chosen: dict[int, str], path: Path) -> None:
    """Output tok/s and TPOT per concurrency, one curve per row; the schedule's choice at
    each level is circled on the throughput panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, levels in rows.items():
        xs = [r.concurrency for r in levels]
        a.plot(xs, [r.output_throughput for r in levels], marker="o", label=name)
        b.plot(xs, [r.tpot_ms_p50 for r in levels], marker="o", label=name)
    rates = {name: _rates(levels) for name, levels in rows.items()}
    picked = [(c, rates[BASELINE if name == "off" else name].get(c))
              for c, name in chosen.items()]
    ringed = [(c, v) for c, v in picked if v is not None]
    a.plot([c for c, _ in ringed], [v for _, v in ringed], color="black", linewidth=2.5,
           alpha=0.35, marker="o", markersize=14, markerfacecolor="none",
           label="schedule")
    a.set(xlabel="concurrency", ylabel="output tokens/s", title="Throughput")
    b.set(xlabel="concurrency", ylabel="TPOT p50 (ms)", title="Latency")
    ticks = sorted(chosen)
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(c) for c in ticks])
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
