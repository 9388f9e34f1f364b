"""The benchmark stage (workers/jobs/bench_stage.py): its progress (measure_rows): a line as
each server starts and as each row finishes a round at a level, in the order measured (rows
reversed every other round), requests done/total over the whole stage, a record for
`eaglenest status` around each measurement; a stop ends it between measurements. Its rows
(a decoding at a K, each its own server started in that decoding) and the schedule chosen
from them: a decoding and a K per concurrency. Row sizing: tests/workers/jobs/
test_bench_rows.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from eaglenest.cli.status import progress_line
from eaglenest.workers.jobs import bench_stage
from eaglenest.workers.jobs.bench_stage import BenchPlan, measure_rows
from eaglenest.workers.jobs.loadgen import LevelResult
from eaglenest.workers.jobs.options import bench_decodings, for_kind, parse_options
from eaglenest.workers.jobs.progress import BenchProgress
from eaglenest.workers.model_servers.schedule import schedule_from


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeServer:
    def __init__(self, name: str, command: list[str] | None = None) -> None:
        self.name, self.command = name, command or []

    def start(self, timeout: float) -> None:
        pass

    def pause(self, paused: bool) -> None:
        pass

    def stop(self) -> None:
        pass


def result(c: int, requests: int, tok_s: float) -> LevelResult:
    return LevelResult(concurrency=c, requests=requests, duration_s=1.0, ttft_ms_p50=1.0,
                       ttft_ms_p90=1.0, tpot_ms_p50=1.0, itl_ms_p50=1.0, e2e_ms_p50=1.0,
                       request_throughput=requests, output_throughput=tok_s,
                       otps_per_request=1.0, output_tokens=int(tok_s), acceptance_length=None,
                       drafts=0.0, accepted=0.0)


@pytest.fixture
def fake_servers(monkeypatch):
    clock = Clock()

    def server(plan, head, k, log_path, sharing, decoding=None):  # noqa: ANN001
        return FakeServer(log_path.stem)

    def measure(server, plan, c):  # noqa: ANN001
        n = bench_stage.requests_per_round(len(plan.prompts), c)
        clock.t += 10.0  # every measurement: 10 s
        return result(c, n, 100.0 if server.name.startswith("baseline") else 120.0)

    monkeypatch.setattr(bench_stage, "_server", server)
    monkeypatch.setattr(bench_stage, "_measure", measure)
    monkeypatch.setattr(bench_stage, "_warm_up", lambda server, plan: None)
    return clock


def plan() -> BenchPlan:
    return BenchPlan(Path("model"), Path("head"), ["p"] * 4, "embedded", (1, 4), 8, 3,
                     ks=(3,), rounds=2, max_rounds=6)  # a round: every prompt, 4 requests


def test_measure_rows_reports_each_server_and_row(fake_servers, caplog, tmp_path):
    """Steady rates: each level gets its 2 rounds and no more (max_rounds 6 unused)."""
    reports: list = []
    progress = BenchProgress("j1", "benchmark baseline vs EAGLE", reports.append, fake_servers)
    caplog.set_level(logging.INFO, logger="eaglenest.optimize")
    rows = measure_rows(plan(), tmp_path, lambda: False, progress)
    assert [len(r) for r in rows["baseline"]] == [2, 2]
    lines = [r.getMessage() for r in caplog.records]
    # 4 requests a measurement in 10 s: ETA = the requests left at 0.4 a second
    assert lines == [
        "job j1: benchmark: starting the baseline server (1/2, embedded)",
        "job j1: benchmark: starting the chain K=3 server (2/2, embedded)",
        "job j1: benchmark: concurrency 1 (level 1/2)  baseline (embedded)  round 1/2  "
        "100.0 tok/s  requests 4/32 (12%)  ETA 1m10s",
        "job j1: benchmark: concurrency 1 (level 1/2)  chain K=3 (embedded)  round 1/2  "
        "120.0 tok/s  requests 8/32 (25%)  ETA 1m00s",
        "job j1: benchmark: concurrency 1 (level 1/2)  chain K=3 (embedded)  round 2/2  "
        "120.0 tok/s  requests 12/32 (37%)  ETA 50s",
        "job j1: benchmark: concurrency 1 (level 1/2)  baseline (embedded)  round 2/2  "
        "100.0 tok/s  requests 16/32 (50%)  ETA 40s",
        "job j1: benchmark: concurrency 4 (level 2/2)  baseline (embedded)  round 1/2  "
        "100.0 tok/s  requests 20/32 (62%)  ETA 30s",
        "job j1: benchmark: concurrency 4 (level 2/2)  chain K=3 (embedded)  round 1/2  "
        "120.0 tok/s  requests 24/32 (75%)  ETA 20s",
        "job j1: benchmark: concurrency 4 (level 2/2)  chain K=3 (embedded)  round 2/2  "
        "120.0 tok/s  requests 28/32 (87%)  ETA 10s",
        "job j1: benchmark: concurrency 4 (level 2/2)  baseline (embedded)  round 2/2  "
        "100.0 tok/s  requests 32/32 (100%)  ETA 0s"]
    measuring = [r for r in reports if r["phase"] == "measuring"]
    assert [(r["level"], r["row"], r["round"], r["requests"]) for r in measuring][:3] == [
        (1, "baseline", 1, 0), (1, "chain K=3", 1, 4), (1, "chain K=3", 2, 8)]
    assert reports[-1]["phase"] == "measured" and reports[-1]["eta_seconds"] == 0


def test_a_stop_ends_it_between_measurements(fake_servers, caplog, tmp_path):
    reports: list = []
    progress = BenchProgress("j1", "benchmark", reports.append, fake_servers)
    stop = iter([False] * 4 + [True])  # 2 server starts, 2 measurements
    rows = measure_rows(plan(), tmp_path, lambda: next(stop), progress)
    # every level has its list from the start; concurrency 4 was never reached
    assert rows["baseline"] == [[result(1, 4, 100.0)], []]
    assert [len(level) for level in rows["chain K=3"]] == [1, 0]
    assert reports[-1]["phase"] == "measured" and reports[-1]["requests"] == 8


class Tracked(FakeServer):
    """Records every start, warm-up and stop in one timeline shared by all servers."""

    timeline: list[tuple[str, str]] = []

    def start(self, timeout: float) -> None:
        self.timeline.append(("start", self.name))

    def warm_up(self) -> None:
        self.timeline.append(("warm-up", self.name))

    def stop(self) -> None:
        self.timeline.append(("stop", self.name))


def test_on_gpus_one_server_runs_at_a_time(fake_servers, monkeypatch, tmp_path):
    """On GPUs each row's server is planned on all the job's GPUs, so it runs alone:
    started, warmed up with a request, measured at every level, stopped before the next
    starts; rows alternate order from round to round and every level still gets one
    measurement per round."""
    Tracked.timeline = []
    monkeypatch.setattr(bench_stage, "_server",
                        lambda plan, head, k, log_path, sharing, decoding=None:
                        Tracked(log_path.stem))
    monkeypatch.setattr(bench_stage, "_warm_up", lambda server, plan: server.warm_up())
    gpu_plan = BenchPlan(Path("model"), Path("head"), ["p"] * 4, "vllm", (1, 4), 8, 3,
                         ks=(1, 3), rounds=2, max_rounds=6, gpus=[0])
    progress = BenchProgress("j1", "benchmark", lambda _: None, fake_servers)
    rows = measure_rows(gpu_plan, tmp_path, lambda: False, progress)
    assert Tracked.timeline == [
        (event, name) for name in ("baseline-server", "chain-k1-server", "chain-k3-server",
                                   "chain-k3-server", "chain-k1-server", "baseline-server")
        for event in ("start", "warm-up", "stop")]
    assert {name: [len(level) for level in levels] for name, levels in rows.items()} == {
        "baseline": [2, 2], "chain K=1": [2, 2], "chain K=3": [2, 2]}
    assert [r.concurrency for r in rows["chain K=3"][1]] == [4, 4]


def test_a_real_benchmark_logs_its_rows_and_no_requests(tiny_llama_dir, tiny_eagle3_dir,
                                                        tmp_path, capfd):
    """The tiny target and head on the embedded backend, under the worker's logging set-up
    (workers/infra/logs.py configure_logging): our lines, none of httpx's per request."""
    from tests.support.logs import configured_logging

    reports: list = []
    bench = BenchPlan(tiny_llama_dir, tiny_eagle3_dir, ["Hello", "The capital of"],
                      "embedded", (1, 2), 4, 1, ks=(1,), rounds=1, startup_timeout=120)
    with configured_logging("text"):
        report = bench_stage.run_benchmark(bench, tmp_path, lambda: False, BenchProgress(
            "tiny", "benchmark baseline vs EAGLE", reports.append))
    err = capfd.readouterr().err
    print(err)
    assert list(report["results"]) == ["baseline", "chain K=1"]
    kernels = report["linear_kernels"]  # each server's own choice, from its log
    assert list(kernels) == ["baseline", "chain K=1"], kernels
    assert kernels["baseline"].startswith("layers=") and ", head=" not in kernels["baseline"]
    assert ", head=" in kernels["chain K=1"]  # the draft head's family too
    assert f"| chain K=1 | {kernels['chain K=1']} |" in (tmp_path / "benchmark.md").read_text()
    assert "HTTP Request" not in err and " httpx " not in err and " httpcore" not in err
    ours = [line.split("INFO eaglenest.optimize ")[1] for line in err.splitlines()
            if "INFO eaglenest.optimize job tiny: benchmark: " in line]
    assert len(ours) == 2 + 4, err  # 2 servers, 2 rows at 2 levels in 1 round
    assert ours[2].startswith("job tiny: benchmark: concurrency 1 (level 1/2)  baseline "
                              "(embedded)  round 1/1  "), ours
    assert ours[-1].startswith("job tiny: benchmark: concurrency 2 (level 2/2)  chain K=1 "
                               "(embedded)  round 1/1  "), ours
    assert ours[-1].endswith(" tok/s  requests 8/8 (100%)  ETA 0s"), ours
    assert reports[-1]["requests"] == reports[-1]["requests_total"] == 8
    last_row = reports[-2]  # `eaglenest status` while the last row is measured
    line = progress_line(last_row, now=last_row["updated"] + 3)
    print(line)
    assert line.startswith("    benchmark baseline vs EAGLE: concurrency 2 (level 2/2)  "
                           "measuring chain K=1 (embedded)  round 1/1  requests 6/8 (75%)  ETA ")
    assert line.endswith("  (updated 3s ago)")


def stand_in(monkeypatch, rates):  # noqa: ANN001
    """Each row's server as the stage builds it (its real command line), standing in for
    the server: its tok/s at concurrency c is ``rates(c, mode, adaptive, K)`` read from that
    command line (K 0 and mode None for the baseline, which has no --head)."""
    real_server = bench_stage._server
    commands: dict[str, list[str]] = {}

    def server(plan, head, k, log_path, sharing, decoding=None):  # noqa: ANN001
        command = real_server(plan, head, k, log_path, sharing, decoding).spec.command()
        commands[log_path.stem] = command
        return FakeServer(log_path.stem, command)

    def measure(srv, plan, c):  # noqa: ANN001
        cmd = srv.command
        if "--head" not in cmd:
            return result(c, 4, rates(c, None, False, 0))
        k = int(cmd[cmd.index("--num-speculative-tokens") + 1])
        return result(c, 4, rates(c, cmd[cmd.index("--mode") + 1], "--adaptive" in cmd, k))

    monkeypatch.setattr(bench_stage, "_server", server)
    monkeypatch.setattr(bench_stage, "_measure", measure)
    monkeypatch.setattr(bench_stage, "_warm_up", lambda server, plan: None)
    return commands


def test_a_stand_in_whose_tree_row_is_fastest_gets_tree(monkeypatch, tmp_path):
    """An EAGLE-3 head on the embedded backend, its kind's decodings (chain at K = 1, 3, 5;
    tree and chain+adaptive at 5), each row a server started in its decoding. The stand-in
    serves the tree fastest alone, chain K=3 best at 4 running and nothing beats the
    baseline at 16: the schedule serves the tree at 1, chain K=3 at 2-4, plain above."""
    opts = parse_options({"EAGLENEST_HEAD": "eagle3", "EAGLENEST_BENCH_CONCURRENCY": "1,4,16"})

    def rates(c, mode, adaptive, k):  # noqa: ANN001
        if mode is None:
            return 100.0
        if c == 1:  # tree 150; chain 110 + 5 K; adaptive chain 125
            return 150.0 if mode == "tree" else 125.0 if adaptive else 110.0 + 5 * k
        if c == 4:
            return {1: 104.0, 3: 112.0, 5: 108.0}[k] if mode == "chain" and not adaptive \
                else 95.0
        return 98.0

    commands = stand_in(monkeypatch, rates)
    head = tmp_path / "head"
    head.mkdir()
    plan = BenchPlan(Path("model"), head, ["p"] * 4, "embedded", opts.concurrency, 8,
                     opts.num_speculative_tokens, ks=opts.measured_ks(), schedule_dir=head,
                     rounds=opts.bench_rounds, max_rounds=opts.bench_max_rounds,
                     decodings=bench_decodings(opts, "eagle3", "embedded"))
    report = bench_stage.run_benchmark(plan, tmp_path, lambda: False)
    rows = ["chain K=1", "chain K=3", "chain K=5", "tree K=5", "chain+adaptive K=5"]
    assert list(report["results"]) == ["baseline", *rows]
    for stem, mode, adaptive in (("tree-k5-server", "tree", False),
                                 ("chain-adaptive-k5-server", "chain", True),
                                 ("chain-k3-server", "chain", False)):
        cmd = commands[stem]
        assert (cmd[cmd.index("--mode") + 1], "--adaptive" in cmd) == (mode, adaptive), cmd
    assert "--adaptive" not in commands["baseline-server"]

    doc = json.loads((head / "speculation_schedule.json").read_text())
    assert doc["thresholds"] == [[1, 5, "tree"], [4, 3, "chain"], [16, 0]]
    schedule = schedule_from(doc, "test")
    assert [(schedule.decoding_for(n), schedule.k_for(n)) for n in (1, 2, 4, 5, 16)] == [
        ("tree", 5), ("chain", 3), ("chain", 3), (None, 0), (None, 0)]
    measured = doc["measured"]
    assert measured["chosen"] == {"1": "tree K=5", "4": "chain K=3", "16": "off"}
    assert measured["rows"] == ["baseline", *rows]
    assert measured["decodings"] == ["chain", "tree", "chain+adaptive"]
    assert measured["output_throughput"]["tree K=5"] == {"1": 150.0, "4": 95.0, "16": 98.0}
    assert measured["output_throughput_by_round"]["tree K=5"]["1"] == [150.0, 150.0]
    assert measured["spread"]["tree K=5"] == {"1": 0.0, "4": 0.0, "16": 0.0}
    assert measured["rounds_by_level"] == {"1": 2, "4": 2, "16": 2}  # steady: no more
    assert report["speedup_by_row"]["tree K=5"]["1"] == 1.5
    assert report["speedup"] == report["speedup_by_row"]["chain K=5"]  # the job's K: 5
    md = (tmp_path / "benchmark.md").read_text()
    assert "Speculation schedule: **tree K=5 at 1 running, chain K=3 at 2-4, off from 5**" in md
    assert ("| concurrency | baseline tok/s | chain K=1 tok/s | chain K=3 tok/s | chain K=5 "
            "tok/s | tree K=5 tok/s | chain+adaptive K=5 tok/s | chosen | rounds | chosen's "
            "spread (pooled) |") in md
    assert ("| 1 | 100.0 | 115.0 | 125.0 | 135.0 | **150.0** | 125.0 | tree K=5 | 2 | "
            "0.0% (0.0%) |") in md
    assert "| 16 | **100.0** | 98.0 | 98.0 | 98.0 | 98.0 | 98.0 | off | 2 | 0.0% (0.0%) |" in md
    assert "| concurrency 1 | 0.0% | 0.0% | 0.0% | 0.0% | 0.0% | 0.0% |" in md
    assert (tmp_path / "benchmark.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_block_heads_rows_run_block_mode_at_each_k_and_the_schedule_picks_among_them(
        monkeypatch, tmp_path):
    """A block head (its kind's default mode drafts a block; here DFlash with 8 slots) is
    benchmarked as any head is at each K, K = drafts per round = 1, 3, 5, 7 (capped by
    block_size - 1), plus block+adaptive at 7 (its kind's decodings: tree and chain are
    not a block head's): one server per row in block mode, rows pooled over the rounds,
    the schedule derived from them and written with the decoding it was measured in."""
    kind = "dflash"
    opts = for_kind(parse_options({"EAGLENEST_HEAD": kind, "EAGLENEST_DFLASH_BLOCK_SIZE": "8",
                                   "EAGLENEST_BENCH_CONCURRENCY": "1,4"}), kind)

    # tok/s: the baseline 100; at 1 running every 2 drafts more add 10 (K=7 best, adaptive
    # 135 below it), at 4 running K=3 is best and K=5, 7 lose to the baseline
    table = {1: {1: 110.0, 3: 120.0, 5: 130.0, 7: 140.0},
             4: {1: 104.0, 3: 112.0, 5: 99.0, 7: 90.0}}

    def rates(c, mode, adaptive, k):  # noqa: ANN001
        if mode is None:
            return 100.0
        assert mode == "block"
        return {1: 135.0, 4: 80.0}[c] if adaptive else table[c][k]

    commands = stand_in(monkeypatch, rates)
    head = tmp_path / "head"
    head.mkdir()
    plan = BenchPlan(Path("model"), head, ["p"] * 4, "embedded", opts.concurrency, 8,
                     opts.num_speculative_tokens, mode="block", ks=opts.measured_ks(),
                     schedule_dir=head, rounds=opts.bench_rounds,
                     decodings=bench_decodings(opts, kind, "embedded"))
    report = bench_stage.run_benchmark(plan, tmp_path, lambda: False)
    assert list(report["results"]) == ["baseline", *(f"block K={k}" for k in (1, 3, 5, 7)),
                                       "block+adaptive K=7"]
    assert "--head" not in commands["baseline-server"]
    for k in (1, 3, 5, 7):
        cmd = commands[f"block-k{k}-server"]
        assert cmd[cmd.index("--mode") + 1] == "block" and "--adaptive" not in cmd
        assert cmd[cmd.index("--num-speculative-tokens") + 1] == str(k)
    assert "--adaptive" in commands["block-adaptive-k7-server"]
    doc = json.loads((head / "speculation_schedule.json").read_text())
    assert doc["mode"] == "block" and doc["measured"]["ks"] == [1, 3, 5, 7]
    assert doc["measured"]["chosen"] == {"1": "block K=7", "4": "block K=3"}
    assert doc["thresholds"] == [[1, 7, "block"], [4, 3, "block"]]
    assert report["speedup"] == {"1": 1.4, "4": 0.9}  # the job's K: 7
    assert "| 1 | 100.0 | 110.0 | 120.0 | 130.0 | **140.0** | 135.0 | block K=7 | 2 | " in (
        tmp_path / "benchmark.md").read_text()
