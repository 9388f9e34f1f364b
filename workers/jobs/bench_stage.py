"""The benchmark stage: baseline (target alone) vs speculative rows, each a decoding at a K
(workers/jobs/bench_rows.py: which rows, how many rounds), same load, same backend, rows
interleaved round by round, and the speculation schedule derived from them
(workers/model_servers/schedule.py ``derive``: a decoding and a K per concurrency).

K is the tokens drafted per round in every decoding: a chain's or a parallel head's drafts,
a tree's depth, a block head's block length minus one (the rows of a block head are K = 1,
3, 5, 7 capped by block_size - 1: workers/jobs/options.py ``for_kind``). Each row is one
server of its decoding at its K (``--mode`` and, for "+adaptive", ``--adaptive``)."""

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
from eaglenest.models.decode.modes import DecodeMode, Decoding
from eaglenest.workers.jobs.bench_report import markdown, plot, server_kernels
from eaglenest.workers.jobs.bench_rows import (
    BASELINE,
    SPREAD,
    Row,
    Sizing,
    plan_rows,
    pooled_spread,
    requests_per_round,
    spread,
)
from eaglenest.workers.jobs.loadgen import (
    BenchConfig,
    LevelResult,
    pool,
    run,
    to_json,
)
from eaglenest.workers.jobs.progress import BenchProgress
from eaglenest.workers.model_servers import gpu_options
from eaglenest.workers.model_servers.process import ServerProcess, ServerSpec, cuda_available
from eaglenest.workers.model_servers.schedule import FILE_NAME, MARGIN, derive

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
    #: the head kind's default mode (HeadSpec.default_mode): the decoding when none is named
    mode: str = DecodeMode.CHAIN
    startup_timeout: float = 900.0
    #: children_dir (foundation/host/children.py) and the job the servers belong to
    children_dir: Path | None = None
    resource: str = ""
    ks: tuple[int, ...] = ()  # the K values measured; () = (num_speculative_tokens,)
    schedule_dir: Path | None = None  # where speculation_schedule.json goes (None: out)
    rounds: int = 2  # measurements of each row at each level at least; a row must win in each
    #: the most rounds at a level (bench_rows.Sizing); below ``rounds``: ``rounds``
    max_rounds: int = 0
    minutes: float = 0.0  # the stage's budget for rounds beyond ``rounds``; 0: none
    #: Decoding names, the first at every K, the others at the largest; (): (mode,)
    decodings: tuple[str, ...] = ()
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

    @property
    def rows(self) -> tuple[Row, ...]:
        """The speculative rows, in the order measured (after the baseline)."""
        return plan_rows(self.decodings or (str(self.mode),), self.measured_ks)


def _server(plan: BenchPlan, head: Path | None, k: int, log_path: Path,
            sharing: int, decoding: str | None = None) -> ServerProcess:
    """One row's server (``decoding`` None: the plan's mode); on GPUs planned on all the
    job's GPUs (it runs alone on them: `measure_rows`), so a model that cannot fit fails the
    stage naming the sizes."""
    drafting = Decoding.parse(decoding or str(plan.mode))
    spec = ServerSpec(model_dir=plan.model_dir, served_name="bench", port=free_port(),
                      backend=plan.backend, head_dir=head, mode=drafting.mode.value,
                      adaptive=drafting.adaptive and head is not None,
                      num_speculative_tokens=k, secret=new_secret(),
                      extra_env={SHARING_ENV: str(sharing)}, kernel_cache=plan.kernel_cache,
                      split=False, vllm_module=plan.vllm_module)
    gpu_options.apply(spec, {}, plan.gpus, plan.gpu_env, plan.held, cuda_available())
    return ServerProcess(spec, log_path, plan.children_dir, plan.resource, "benchmark-server")


def _measure(server: ServerProcess, plan: BenchPlan, c: int) -> LevelResult:
    cfg = BenchConfig(base_url=server.base_url, model="bench", prompts=plan.prompts,
                      api_key=server.spec.secret, concurrencies=(c,),
                      max_tokens=plan.max_tokens,
                      requests_per_level=requests_per_round(len(plan.prompts), c))
    server.pause(False)
    try:
        return asyncio.run(run(cfg))[0]
    finally:
        server.pause(True)


def _warm_up(server: ServerProcess, plan: BenchPlan) -> None:
    """One untimed request (the first prompt, alone) before a server is measured: its first
    request pays one-time costs (kernel timings of new shapes, an adaptive controller's first
    estimates) that would otherwise land in round 1 of its first level alone."""
    cfg = BenchConfig(base_url=server.base_url, model="bench", prompts=plan.prompts[:1],
                      api_key=server.spec.secret, concurrencies=(1,),
                      max_tokens=plan.max_tokens, requests_per_level=1)
    asyncio.run(run(cfg))


Rounds = dict[str, list[list[LevelResult]]]  # row name -> per level -> per round


def _row_servers(plan: BenchPlan, logs: Path, sharing: int) -> dict[str, Any]:
    """Row name -> a function that builds its server (baseline first, then plan.rows)."""
    stems = log_stems(plan)
    rows: dict[str, Any] = {BASELINE: lambda: _server(
        plan, None, plan.num_speculative_tokens, logs / f"{stems[BASELINE]}.log", sharing)}
    for row in plan.rows:
        rows[row.name] = (lambda row=row: _server(plan, plan.head_dir, row.k,
                                                  logs / f"{stems[row.name]}.log", sharing,
                                                  row.decoding))
    return rows


def log_stems(plan: BenchPlan) -> dict[str, str]:
    """Row name -> its server's log file name under the stage's logs/ (without .log)."""
    return {BASELINE: "baseline-server", **{r.name: r.log_stem for r in plan.rows}}


def _rates_at(rows: Rounds, level: int) -> dict[str, list[float]]:
    """Each row's per-round output tok/s at the level of index ``level``."""
    return {name: [r.output_throughput for r in levels[level]]
            for name, levels in rows.items() if len(levels) > level}


def measure_rows(plan: BenchPlan, logs: Path, should_stop: Any,
                 progress: BenchProgress) -> Rounds:
    """Every row (baseline, then plan.rows) at every concurrency, in rounds sized by
    bench_rows.Sizing (at least ``plan.rounds``; more while a watched row's pooled spread
    is 5% or more, within ``plan.max_rounds`` and ``plan.minutes`` counted from here on
    ``progress.clock``), rows interleaved, the order reversed from round to round (rows A B
    C then C B A: a host whose speed drifts shifts every row alike instead of whichever row
    ran last). Each server answers one untimed request once started (`_warm_up`).
    On the CPU all servers are loaded up front and paused (SIGSTOP); each is resumed in
    turn for its measurement. Every level gets its first ``plan.rounds`` rounds (lowest
    concurrency first), then each level, lowest first, the extra rounds Sizing finds due
    while they fit (a spare minute goes to concurrency 1 before 4). Each server is sized
    for the CPUs as if it ran alone (it does, while measured).
    On GPUs one server runs at a time (`_one_at_a_time`).
    Stopped early: the rounds measured so far (a level not reached: none). ``progress`` hears
    of each server start, each measurement and each round added (workers/jobs/progress.py)."""
    builders = _row_servers(plan, logs, ComputeLedger().running() + 1)
    sizing = Sizing(max(1, plan.rounds), plan.max_rounds, 60 * plan.minutes, progress.clock,
                    progress.clock())
    per_round = {c: requests_per_round(len(plan.prompts), c) for c in plan.concurrency}
    progress.plan(plan.backend, per_round, len(builders), sizing.rounds)
    if plan.gpus:
        return _one_at_a_time(plan, builders, sizing, should_stop, progress)
    servers = {name: build() for name, build in builders.items()}
    rows: Rounds = {name: [] for name in servers}
    try:
        for i, (name, server) in enumerate(servers.items()):  # one at a time: CPU-heavy
            if should_stop():
                return rows
            progress.starting(name, i + 1, len(servers))
            server.start(plan.startup_timeout)
            _warm_up(server, plan)
            server.pause(True)
        for levels in rows.values():
            levels.extend([] for _ in plan.concurrency)
        seconds = [0.0] * len(plan.concurrency)  # each level's last round, in seconds
        for extra in (False, True):  # every level's first rounds, then extra ones
            for i in range(len(plan.concurrency)):
                took = _size_level(plan, servers, rows, i, sizing, seconds[i], extra,
                                   should_stop, progress)
                if took is None:
                    return rows
                seconds[i] = took
        return rows
    finally:
        for server in servers.values():
            server.stop()


def _size_level(plan: BenchPlan, servers: dict[str, ServerProcess], rows: Rounds, i: int,
                sizing: Sizing, seconds: float, extra: bool, should_stop: Any,
                progress: BenchProgress) -> float | None:
    """CPU: rounds of every row at the level of index ``i``: its first ``sizing.rounds``,
    or (``extra``) those Sizing still finds due, each priced at the level's last round
    (``seconds`` long). Returns how long the last round took; None: stopped."""
    c, names = plan.concurrency[i], list(servers)
    done = len(rows[BASELINE][i])
    while True:
        if not extra and done >= sizing.rounds:
            break
        if extra:
            due = sizing.more(done, _rates_at(rows, i), plan.rows, seconds)
            if due is None:
                break
            progress.round_added(c, *due)
        began = sizing.clock()
        for name in names if done % 2 == 0 else names[::-1]:
            if should_stop():
                return None
            _measure_into(rows, name, servers[name], plan, c, done, progress, i)
        seconds, done = sizing.clock() - began, done + 1
    return seconds


def _measure_into(rows: Rounds, name: str, server: ServerProcess, plan: BenchPlan, c: int,
                  r: int, progress: BenchProgress, level: int = -1) -> None:
    """Measure `name`'s row at concurrency `c` in round `r` into its `level`'s rounds."""
    progress.measuring(c, name, r)
    result = _measure(server, plan, c)
    progress.measured(name, r, result.requests, result.output_throughput)
    rows[name][level].append(result)


def _one_at_a_time(plan: BenchPlan, builders: dict[str, Any], sizing: Sizing,
                   should_stop: Any, progress: BenchProgress) -> Rounds:
    """GPUs: in round r each row's server alone on the job's GPUs (rows in order, reversed
    in odd rounds), measured at every level the round covers, stopped before the next
    row's starts. The first ``sizing.rounds`` rounds cover every level; each round after
    covers the levels Sizing still finds due (a round more costs every server a start, so
    the last round's whole time is what it is checked against the budget with)."""
    names = list(builders)
    rows: Rounds = {name: [[] for _ in plan.concurrency] for name in names}
    levels, starts, planned, r = list(range(len(plan.concurrency))), 0, sizing.rounds, 0
    while levels:
        began = sizing.clock()
        for name in names if r % 2 == 0 else names[::-1]:
            if should_stop():
                return rows
            starts += 1
            progress.starting(name, starts, len(names) * planned)
            if not _serve_levels(plan, builders[name](), rows, name, levels, r, should_stop,
                                 progress):
                return rows
        r += 1
        levels = _levels_due(plan, rows, sizing, r, sizing.clock() - began, progress)
        if r >= sizing.rounds and levels:
            planned += 1
    return rows


def _serve_levels(plan: BenchPlan, server: ServerProcess, rows: Rounds, name: str,
                  levels: list[int], r: int, should_stop: Any, progress: BenchProgress) -> bool:
    """GPUs: start ``name``'s server, measure it at the levels of those indexes in round
    ``r``, stop it; False: stopped."""
    try:
        server.start(plan.startup_timeout)
        _warm_up(server, plan)
        server.pause(True)
        for i in levels:
            if should_stop():
                return False
            _measure_into(rows, name, server, plan, plan.concurrency[i], r, progress, i)
    finally:
        server.stop()
    return True


def _levels_due(plan: BenchPlan, rows: Rounds, sizing: Sizing, done: int, seconds: float,
                progress: BenchProgress) -> list[int]:
    """GPUs: the indexes of the levels the next round covers after ``done`` rounds (those
    the last round covered, ``seconds`` long, that Sizing finds due); each one beyond
    ``sizing.rounds`` is reported added."""
    due = []
    for i, c in enumerate(plan.concurrency):
        if len(rows[BASELINE][i]) != done:  # left behind in an earlier round
            continue
        more = sizing.more(done, _rates_at(rows, i), plan.rows, seconds)
        if more is not None:
            due.append(i)
            if done >= sizing.rounds:
                progress.round_added(c, *more)
    return due


def _pooled(rows: Rounds) -> dict[str, list[LevelResult]]:
    return {name: [pool(rounds) for rounds in levels if rounds] for name, levels in rows.items()}


def _round_rates(levels: list[list[LevelResult]]) -> dict[int, list[float]]:
    return {rounds[0].concurrency: [r.output_throughput for r in rounds]
            for rounds in levels if rounds}


def _rates(levels: list[LevelResult]) -> dict[int, float]:
    return {r.concurrency: r.output_throughput for r in levels}


def _by_level(table: dict[str, dict[int, Any]]) -> dict[str, dict[str, Any]]:
    """JSON keys: {"chain K=3": {1: x}} -> {"chain K=3": {"1": x}}."""
    return {name: {str(c): v for c, v in levels.items()} for name, levels in table.items()}


def run_benchmark(plan: BenchPlan, out: Path, should_stop: Any,
                  progress: BenchProgress | None = None) -> dict[str, Any]:
    """Measure every row, derive the schedule, write benchmark.json/.md/.png into ``out`` and
    speculation_schedule.json into ``plan.schedule_dir``. Returns the report ({} when stopped
    before the end: the caller's next check stops the job). ``progress`` None: progress lines
    in the log only, no job named, nothing recorded (`eaglenest bench`).

    The report (benchmark.json) holds loadgen's ``results`` per row (all rounds pooled),
    ``speedup_by_row`` (pooled tok/s over the baseline's per row and concurrency), ``speedup``
    (that of the plan's first decoding at the job's K) and ``schedule``: the thresholds and
    ``measured``: per row and concurrency the pooled ``output_throughput``, the per-round
    ``output_throughput_by_round``, their ``spread`` and ``pooled_spread``
    (workers/jobs/bench_rows.py); ``rounds_by_level``; ``chosen`` per concurrency, a row name
    ("tree K=4") or "off"; ``linear_kernels``: per row, the linear kernels its embedded
    server chose (bench_report.server_kernels; absent for a vLLM row)."""
    progress = progress or BenchProgress(None, "benchmark", lambda _: None)
    measured_rounds = measure_rows(plan, out / "logs", should_stop, progress)
    if should_stop():
        return {}
    rows = _pooled(measured_rounds)
    by_round = {name: _round_rates(levels) for name, levels in measured_rounds.items()}
    schedule, picked = derive(by_round[BASELINE], {(r.decoding, r.k): by_round[r.name]
                                                   for r in plan.rows})
    chosen = {c: Row(decoding, k).name if k else "off" for c, (decoding, k) in picked.items()}
    doc = {"thresholds": schedule.to_list(), "backend": plan.backend, "mode": plan.mode,
           "measured": _measured(plan, rows, by_round, chosen)}
    (plan.schedule_dir or out).mkdir(parents=True, exist_ok=True)
    ((plan.schedule_dir or out) / FILE_NAME).write_text(json.dumps(doc, indent=1))
    log.info("speculation schedule %s (per concurrency %s)", schedule.to_env(), chosen)
    report = to_json(rows, backend=plan.backend, prompts=len(plan.prompts),
                     max_tokens=plan.max_tokens,
                     num_speculative_tokens=plan.num_speculative_tokens)
    report["schedule"] = doc
    report["speedup_by_row"] = {r.name: _speedup(rows[BASELINE], rows[r.name])
                                for r in plan.rows}
    main_k = (plan.num_speculative_tokens if plan.num_speculative_tokens in plan.measured_ks
              else max(plan.measured_ks))
    report["speedup"] = report["speedup_by_row"][Row(plan.rows[0].decoding, main_k).name]
    report["linear_kernels"] = server_kernels(out / "logs", log_stems(plan))
    (out / "benchmark.json").write_text(json.dumps(report, indent=1))
    (out / "benchmark.md").write_text(markdown(plan, rows, by_round, schedule, chosen,
                                               report["linear_kernels"]))
    plot(rows, chosen, out / "benchmark.png")
    return report


def _measured(plan: BenchPlan, rows: dict[str, list[LevelResult]],
              by_round: dict[str, dict[int, list[float]]], chosen: dict[int, str]
              ) -> dict[str, Any]:
    """The schedule document's ``measured`` part (run_benchmark's docstring)."""
    return {"concurrency": list(plan.concurrency), "ks": list(plan.measured_ks),
            "decodings": list(plan.decodings or (str(plan.mode),)),
            "rows": [BASELINE, *(r.name for r in plan.rows)], "margin": MARGIN,
            "rounds": plan.rounds, "max_rounds": max(plan.rounds, plan.max_rounds),
            "spread_target": SPREAD,
            "rounds_by_level": {str(c): len(v) for c, v in by_round[BASELINE].items()},
            "chosen": {str(c): name for c, name in chosen.items()},
            "output_throughput": _by_level({n: _rates(v) for n, v in rows.items()}),
            "output_throughput_by_round": _by_level(by_round),
            "spread": _by_level({n: {c: spread(v) for c, v in levels.items()}
                                 for n, levels in by_round.items()}),
            "pooled_spread": _by_level({n: {c: pooled_spread(v) for c, v in levels.items()}
                                        for n, levels in by_round.items()})}


def _speedup(base: list[LevelResult], eagle: list[LevelResult]) -> dict[str, float]:
    return {str(b.concurrency): e.output_throughput / b.output_throughput
            for b, e in zip(base, eagle, strict=False) if b.output_throughput > 0}
