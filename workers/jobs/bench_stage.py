"""The benchmark stage: baseline (target alone) vs speculative at each K, same load, same
backend, each level measured in ``rounds`` rounds, and the speculation schedule derived from
it (workers/model_servers/schedule.py).

K is the tokens drafted per round in every mode (``BenchPlan.mode``: the head kind's
default mode): a chain's depth, a parallel head's mask slots, a block head's block length
minus one (the rows of a block head are K = 1, 3, 5, 7 capped by block_size - 1:
workers/jobs/options.py ``for_kind``). Each row is one server of that mode at that K."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglenest.foundation.host.processes import free_port
from eaglenest.foundation.host.threads import SHARING_ENV, ComputeLedger
from eaglenest.foundation.http.instance_auth import new_secret
from eaglenest.foundation.memory_plan import Gpus
from eaglenest.models.decode.modes import DecodeMode
from eaglenest.workers.jobs.loadgen import (
    BenchConfig,
    LevelResult,
    pool,
    run,
    to_json,
    to_markdown,
)
from eaglenest.workers.jobs.progress import BenchProgress
from eaglenest.workers.model_servers import gpu_options
from eaglenest.workers.model_servers.process import ServerProcess, ServerSpec, cuda_available
from eaglenest.workers.model_servers.schedule import FILE_NAME, MARGIN, Schedule, derive

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
    mode: str = DecodeMode.CHAIN
    startup_timeout: float = 900.0
    #: children_dir (foundation/host/children.py) and the job the servers belong to
    children_dir: Path | None = None
    resource: str = ""
    ks: tuple[int, ...] = ()  # the K values measured; () = (num_speculative_tokens,)
    schedule_dir: Path | None = None  # where speculation_schedule.json goes (None: out)
    rounds: int = 2  # measurements of each row at each level; a K must win in every one
    #: the job's GPUs (workers/jobs/placing.py): every server is shown these, and only these
    gpus: list[int] = field(default_factory=list)
    gpu_env: dict[str, str] = field(default_factory=dict)
    #: what those GPUs are (foundation/memory_plan.py): each server is planned on all of them
    held: Gpus = field(default_factory=lambda: Gpus(0, 0))
    #: the host's linear-kernel timing cache for embedded servers (None: each measures)
    kernel_cache: Path | None = None
    #: what `python -m` runs for a vLLM server (Settings.vllm_module)
    vllm_module: str = "vllm.entrypoints.openai.api_server"

    @property
    def measured_ks(self) -> tuple[int, ...]:
        return self.ks or (self.num_speculative_tokens,)


def row_name(k: int) -> str:
    return f"eagle K={k}"


def _server(plan: BenchPlan, head: Path | None, k: int, log_path: Path,
            sharing: int) -> ServerProcess:
    """One row's server; on GPUs planned on all the job's GPUs (it runs alone on them:
    `measure_rows`), so a model that cannot fit fails the stage naming the sizes."""
    spec = ServerSpec(model_dir=plan.model_dir, served_name="bench", port=free_port(),
                      backend=plan.backend, head_dir=head, mode=plan.mode,
                      num_speculative_tokens=k, secret=new_secret(),
                      extra_env={SHARING_ENV: str(sharing)}, kernel_cache=plan.kernel_cache,
                      split=False, vllm_module=plan.vllm_module)
    gpu_options.apply(spec, {}, plan.gpus, plan.gpu_env, plan.held, cuda_available())
    return ServerProcess(spec, log_path, plan.children_dir, plan.resource, "benchmark-server")


def requests_per_round(prompts: int, c: int, rounds: int) -> int:
    """A level's requests (every prompt once, and at least 2 per concurrent slot) split over
    the rounds, at least one per slot: the stage takes as long with 2 rounds as with 1.
    Example: 8 prompts, 2 rounds: c=1 -> 4 a round, c=4 -> 4, c=16 -> 16 (32 in all)."""
    return max(c, -(-max(prompts, 2 * c) // max(1, rounds)))


def _measure(server: ServerProcess, plan: BenchPlan, c: int) -> LevelResult:
    cfg = BenchConfig(base_url=server.base_url, model="bench", prompts=plan.prompts,
                      api_key=server.spec.secret, concurrencies=(c,),
                      max_tokens=plan.max_tokens,
                      requests_per_level=requests_per_round(len(plan.prompts), c, plan.rounds))
    server.pause(False)
    try:
        return asyncio.run(run(cfg))[0]
    finally:
        server.pause(True)


Rounds = dict[str, list[list[LevelResult]]]  # row name -> per level -> per round


def _row_servers(plan: BenchPlan, logs: Path, sharing: int) -> dict[str, Any]:
    """Row name -> a function that builds its server (baseline first, then one per K)."""
    rows: dict[str, Any] = {"baseline": lambda: _server(
        plan, None, plan.num_speculative_tokens, logs / "baseline-server.log", sharing)}
    for k in plan.measured_ks:
        rows[row_name(k)] = (lambda k=k: _server(plan, plan.head_dir, k,
                                                 logs / f"eagle-k{k}-server.log", sharing))
    return rows


def measure_rows(plan: BenchPlan, logs: Path, should_stop: Any,
                 progress: BenchProgress) -> Rounds:
    """Every row (baseline, then one per K) at every concurrency, ``plan.rounds`` times, rows
    interleaved, the order reversed from round to round (rows A B C then C B A: a host
    whose speed drifts shifts every row alike instead of whichever row ran last).
    On the CPU all servers are loaded up front and paused (SIGSTOP); at each level each is
    resumed in turn for its measurement. Each is sized for the CPUs as if it ran alone (it
    does, while measured). On GPUs one server runs at a time, planned on all the job's GPUs
    (two would each need the weights and a KV cache): each round starts each row's server,
    measures it at every level, and stops it before the next starts.
    Stopped early: the levels measured so far, the last maybe partial. ``progress`` hears
    of each server start and each measurement (workers/jobs/progress.py)."""
    builders = _row_servers(plan, logs, ComputeLedger().running() + 1)
    rounds = max(1, plan.rounds)
    progress.plan(plan.backend, {c: requests_per_round(len(plan.prompts), c, rounds)
                                 for c in plan.concurrency}, len(builders), rounds)
    if plan.gpus:
        return _one_at_a_time(plan, builders, rounds, should_stop, progress)
    servers = {name: build() for name, build in builders.items()}
    rows: Rounds = {name: [] for name in servers}
    try:
        for i, (name, server) in enumerate(servers.items()):  # one at a time: CPU-heavy
            if should_stop():
                return rows
            progress.starting(name, i + 1, len(servers))
            server.start(plan.startup_timeout)
            server.pause(True)
        names = list(servers)
        for c in plan.concurrency:
            for levels in rows.values():
                levels.append([])
            for r in range(rounds):
                for name in names if r % 2 == 0 else names[::-1]:
                    if should_stop():
                        return rows
                    _measure_into(rows, name, servers[name], plan, c, r, progress)
        return rows
    finally:
        for server in servers.values():
            server.stop()


def _measure_into(rows: Rounds, name: str, server: ServerProcess, plan: BenchPlan, c: int,
                  r: int, progress: BenchProgress, level: int = -1) -> None:
    """Measure `name`'s row at concurrency `c` in round `r` into its `level`'s rounds."""
    progress.measuring(c, name, r)
    result = _measure(server, plan, c)
    progress.measured(name, r, result.requests, result.output_throughput)
    rows[name][level].append(result)


def _one_at_a_time(plan: BenchPlan, builders: dict[str, Any], rounds: int, should_stop: Any,
                   progress: BenchProgress) -> Rounds:
    """GPUs: in round r each row's server alone on the job's GPUs (rows in order, reversed
    in odd rounds), measured at every level, stopped before the next row's starts."""
    names = list(builders)
    rows: Rounds = {name: [[] for _ in plan.concurrency] for name in names}
    starts = 0
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            if should_stop():
                return rows
            starts += 1
            progress.starting(name, starts, len(names) * rounds)
            server = builders[name]()
            try:
                server.start(plan.startup_timeout)
                server.pause(True)
                for i, c in enumerate(plan.concurrency):
                    if should_stop():
                        return rows
                    _measure_into(rows, name, server, plan, c, r, progress, i)
            finally:
                server.stop()
    return rows


def _pooled(rows: Rounds) -> dict[str, list[LevelResult]]:
    return {name: [pool(rounds) for rounds in levels] for name, levels in rows.items()}


def _round_rates(levels: list[list[LevelResult]]) -> dict[int, list[float]]:
    return {rounds[0].concurrency: [r.output_throughput for r in rounds] for rounds in levels}


def _rates(levels: list[LevelResult]) -> dict[int, float]:
    return {r.concurrency: r.output_throughput for r in levels}


def run_benchmark(plan: BenchPlan, out: Path, should_stop: Any,
                  progress: BenchProgress | None = None) -> dict[str, Any]:
    """Measure every row, derive the schedule, write benchmark.json/.md/.png into ``out`` and
    speculation_schedule.json into ``plan.schedule_dir``. Returns the report ({} when stopped
    before the end: the caller's next check stops the job). ``progress`` None: progress lines
    in the log only, no job named, nothing recorded (`eaglenest bench`)."""
    progress = progress or BenchProgress(None, "benchmark", lambda _: None)
    measured_rounds = measure_rows(plan, out / "logs", should_stop, progress)
    if should_stop():
        return {}
    rows = _pooled(measured_rounds)
    schedule, chosen = derive(_round_rates(measured_rounds["baseline"]),
                              {k: _round_rates(measured_rounds[row_name(k)])
                               for k in plan.measured_ks})
    measured = {"concurrency": list(plan.concurrency), "ks": list(plan.measured_ks),
                "margin": MARGIN, "rounds": plan.rounds,
                "chosen": {str(c): k for c, k in chosen.items()},
                "output_throughput": {name: {str(c): v for c, v in _rates(levels).items()}
                                      for name, levels in rows.items()},
                "output_throughput_by_round": {
                    name: {str(c): v for c, v in _round_rates(levels).items()}
                    for name, levels in measured_rounds.items()}}
    doc = {"thresholds": schedule.to_list(), "backend": plan.backend, "mode": plan.mode,
           "measured": measured}
    (plan.schedule_dir or out).mkdir(parents=True, exist_ok=True)
    ((plan.schedule_dir or out) / FILE_NAME).write_text(json.dumps(doc, indent=1))
    log.info("speculation schedule %s (K per concurrency %s)", schedule.to_env(), chosen)
    report = to_json(rows, backend=plan.backend, prompts=len(plan.prompts),
                     max_tokens=plan.max_tokens,
                     num_speculative_tokens=plan.num_speculative_tokens)
    report["schedule"] = doc
    report["speedup_by_k"] = {str(k): _speedup(rows["baseline"], rows[row_name(k)])
                              for k in plan.measured_ks}
    main_k = (plan.num_speculative_tokens if plan.num_speculative_tokens in plan.measured_ks
              else max(plan.measured_ks))
    report["speedup"] = report["speedup_by_k"][str(main_k)]
    (out / "benchmark.json").write_text(json.dumps(report, indent=1))
    (out / "benchmark.md").write_text(markdown(plan, rows, schedule, chosen))
    plot(rows, chosen, out / "benchmark.png")
    return report


def _speedup(base: list[LevelResult], eagle: list[LevelResult]) -> dict[str, float]:
    return {str(b.concurrency): e.output_throughput / b.output_throughput
            for b, e in zip(base, eagle, strict=False) if b.output_throughput > 0}


def describe(schedule: Schedule) -> str:
    """Example: [[1, 5], [4, 3], [16, 0]] -> "K=5 at 1 running, K=3 at 2-4, off from 5"."""
    if len(schedule.thresholds) == 1:
        k = schedule.thresholds[0][1]
        return f"{f'K={k}' if k else 'off'} at every load"
    parts, start = [], 1
    for i, (max_running, k) in enumerate(schedule.thresholds):
        what = f"K={k}" if k else "off"
        last = i == len(schedule.thresholds) - 1
        span = (f"from {start}" if last else
                f"at {start}" if start == max_running else f"at {start}-{max_running}")
        parts.append(f"{what} {span}" + (" running" if i == 0 else ""))
        start = max_running + 1
    return ", ".join(parts)


def markdown(plan: BenchPlan, rows: dict[str, list[LevelResult]], schedule: Schedule,
             chosen: dict[int, int]) -> str:
    ks = ", ".join(str(k) for k in plan.measured_ks)
    md = (f"Serving backend: **{plan.backend}**; K measured: {ks}; {len(plan.prompts)} "
          f"held-out prompts; {plan.max_tokens} tokens each.\n\n"
          f"Speculation schedule: **{describe(schedule)}** (`{schedule.to_env()}`: at each "
          f"concurrency the K with the highest output tok/s among those that beat the "
          f"baseline by more than {MARGIN:.0%} in each of {plan.rounds} rounds, never deeper "
          f"than the level below's; once off, off above). Figures: all rounds pooled.\n\n")
    head = "| concurrency | baseline tok/s | " + " | ".join(
        f"K={k} tok/s" for k in plan.measured_ks) + " | chosen |"
    lines = [head, "|" + "---|" * (len(plan.measured_ks) + 3)]
    rates = {name: _rates(levels) for name, levels in rows.items()}
    for c, k in chosen.items():
        cells = [f"{rates['baseline'].get(c, 0):.1f}"]
        for kk in plan.measured_ks:
            v = f"{rates[row_name(kk)].get(c, 0):.1f}"
            cells.append(f"**{v}**" if kk == k else v)
        lines.append(f"| {c} | " + " | ".join(cells) + f" | {'K=' + str(k) if k else 'off'} |")
    return md + "\n".join(lines) + "\n\n" + to_markdown(rows)


def plot(rows: dict[str, list[LevelResult]], chosen: dict[int, int], path: Path) -> None:
    """Output tok/s and TPOT per concurrency, one curve per K; the schedule's choice at each
    level is circled on the throughput panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, levels in rows.items():
        xs = [r.concurrency for r in levels]
        a.plot(xs, [r.output_throughput for r in levels], marker="o", label=name)
        b.plot(xs, [r.tpot_ms_p50 for r in levels], marker="o", label=name)
    rates = {name: _rates(levels) for name, levels in rows.items()}
    picked = [(c, rates["baseline" if k == 0 else row_name(k)].get(c)) for c, k in chosen.items()]
    picked = [(c, v) for c, v in picked if v is not None]
    a.plot([c for c, _ in picked], [v for _, v in picked], color="black", linewidth=2.5,
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
