"""The benchmark stage's progress (workers/jobs/bench_stage.py measure_rows): a line as each
server starts and as each row finishes a round at a level, in the order measured (rows
reversed every other round), requests done/total over the whole stage, a record for
`eaglenest status` around each measurement; a stop ends it between measurements."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from eaglenest.cli.status import progress_line
from eaglenest.workers.jobs import bench_stage
from eaglenest.workers.jobs.bench_stage import BenchPlan, measure_rows
from eaglenest.workers.jobs.loadgen import LevelResult
from eaglenest.workers.jobs.progress import BenchProgress


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeServer:
    def __init__(self, name: str) -> None:
        self.name = name

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

    def server(plan, head, k, log_path, sharing):  # noqa: ANN001
        return FakeServer(log_path.stem)

    def measure(server, plan, c):  # noqa: ANN001
        n = bench_stage.requests_per_round(len(plan.prompts), c, plan.rounds)
        clock.t += 10.0  # every measurement: 10 s
        return result(c, n, 100.0 if server.name.startswith("baseline") else 120.0)

    monkeypatch.setattr(bench_stage, "_server", server)
    monkeypatch.setattr(bench_stage, "_measure", measure)
    return clock


def plan() -> BenchPlan:
    return BenchPlan(Path("model"), Path("head"), ["p"] * 4, "embedded", (1, 4), 8, 3,
                     ks=(3,), rounds=2)  # per round: c=1 -> 2 requests, c=4 -> 4


def test_measure_rows_reports_each_server_and_row(fake_servers, caplog, tmp_path):
    reports: list = []
    progress = BenchProgress("j1", "benchmark baseline vs EAGLE", reports.append, fake_servers)
    caplog.set_level(logging.INFO, logger="eaglenest.optimize")
    rows = measure_rows(plan(), tmp_path, lambda: False, progress)
    assert [len(r) for r in rows["baseline"]] == [2, 2]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "job j1: benchmark: starting the baseline server (1/2, embedded)",
        "job j1: benchmark: starting the eagle K=3 server (2/2, embedded)",
        "job j1: benchmark: concurrency 1 (level 1/2)  baseline (embedded)  round 1/2  "
        "100.0 tok/s  requests 2/24 (8%)  ETA 1m50s",
        "job j1: benchmark: concurrency 1 (level 1/2)  eagle K=3 (embedded)  round 1/2  "
        "120.0 tok/s  requests 4/24 (16%)  ETA 1m40s",
        "job j1: benchmark: concurrency 1 (level 1/2)  eagle K=3 (embedded)  round 2/2  "
        "120.0 tok/s  requests 6/24 (25%)  ETA 1m30s",
        "job j1: benchmark: concurrency 1 (level 1/2)  baseline (embedded)  round 2/2  "
        "100.0 tok/s  requests 8/24 (33%)  ETA 1m20s",
        "job j1: benchmark: concurrency 4 (level 2/2)  baseline (embedded)  round 1/2  "
        "100.0 tok/s  requests 12/24 (50%)  ETA 30s",
        "job j1: benchmark: concurrency 4 (level 2/2)  eagle K=3 (embedded)  round 1/2  "
        "120.0 tok/s  requests 16/24 (66%)  ETA 20s",
        "job j1: benchmark: concurrency 4 (level 2/2)  eagle K=3 (embedded)  round 2/2  "
        "120.0 tok/s  requests 20/24 (83%)  ETA 10s",
        "job j1: benchmark: concurrency 4 (level 2/2)  baseline (embedded)  round 2/2  "
        "100.0 tok/s  requests 24/24 (100%)  ETA 0s"]
    measuring = [r for r in reports if r["phase"] == "measuring"]
    assert [(r["level"], r["row"], r["round"], r["requests"]) for r in measuring][:3] == [
        (1, "baseline", 1, 0), (1, "eagle K=3", 1, 2), (1, "eagle K=3", 2, 4)]
    assert reports[-1]["phase"] == "measured" and reports[-1]["eta_seconds"] == 0


def test_a_stop_ends_it_between_measurements(fake_servers, caplog, tmp_path):
    reports: list = []
    progress = BenchProgress("j1", "benchmark", reports.append, fake_servers)
    stop = iter([False] * 4 + [True])  # 2 server starts, 2 measurements
    rows = measure_rows(plan(), tmp_path, lambda: next(stop), progress)
    assert rows["baseline"] == [[result(1, 2, 100.0)]] and len(rows["eagle K=3"][0]) == 1
    assert reports[-1]["phase"] == "measured" and reports[-1]["requests"] == 4


class Tracked(FakeServer):
    """Records every start and stop in one timeline shared by all servers."""

    timeline: list[tuple[str, str]] = []

    def start(self, timeout: float) -> None:
        self.timeline.append(("start", self.name))

    def stop(self) -> None:
        self.timeline.append(("stop", self.name))


def test_on_gpus_one_server_runs_at_a_time(fake_servers, monkeypatch, tmp_path):
    """On GPUs each row's server is planned on all the job's GPUs, so it runs alone:
    started, measured at every level, stopped before the next starts; rows alternate
    order from round to round and every level still gets one measurement per round."""
    Tracked.timeline = []
    monkeypatch.setattr(bench_stage, "_server",
                        lambda plan, head, k, log_path, sharing: Tracked(log_path.stem))
    gpu_plan = BenchPlan(Path("model"), Path("head"), ["p"] * 4, "vllm", (1, 4), 8, 3,
                         ks=(1, 3), rounds=2, gpus=[0])
    progress = BenchProgress("j1", "benchmark", lambda _: None, fake_servers)
    rows = measure_rows(gpu_plan, tmp_path, lambda: False, progress)
    assert Tracked.timeline == [
        (event, name) for name in ("baseline-server", "eagle-k1-server", "eagle-k3-server",
                                   "eagle-k3-server", "eagle-k1-server", "baseline-server")
        for event in ("start", "stop")]
    assert {name: [len(level) for level in levels] for name, levels in rows.items()} == {
        "baseline": [2, 2], "eagle K=1": [2, 2], "eagle K=3": [2, 2]}
    assert [r.concurrency for r in rows["eagle K=3"][1]] == [4, 4]


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
    assert list(report["results"]) == ["baseline", "eagle K=1"]
    assert "HTTP Request" not in err and " httpx " not in err and " httpcore" not in err
    ours = [line.split("INFO eaglenest.optimize ")[1] for line in err.splitlines()
            if "INFO eaglenest.optimize job tiny: benchmark: " in line]
    assert len(ours) == 2 + 4, err  # 2 servers, 2 rows at 2 levels in 1 round
    assert ours[2].startswith("job tiny: benchmark: concurrency 1 (level 1/2)  baseline "
                              "(embedded)  round 1/1  "), ours
    assert ours[-1].startswith("job tiny: benchmark: concurrency 2 (level 2/2)  eagle K=1 "
                               "(embedded)  round 1/1  "), ours
    assert ours[-1].endswith(" tok/s  requests 12/12 (100%)  ETA 0s"), ours
    assert reports[-1]["requests"] == reports[-1]["requests_total"] == 12
    last_row = reports[-2]  # `eaglenest status` while the last row is measured
    line = progress_line(last_row, now=last_row["updated"] + 3)
    print(line)
    assert line.startswith("    benchmark baseline vs EAGLE: concurrency 2 (level 2/2)  "
                           "measuring eagle K=1 (embedded)  round 1/1  requests 8/12 (66%)  ETA ")
    assert line.endswith("  (updated 3s ago)")


def test_a_block_heads_rows_run_block_mode_at_each_k_and_the_schedule_picks_among_them(
        monkeypatch, tmp_path):
    """A block head (its kind's default mode drafts a block; here DFlash with 8 slots) is
    benchmarked as any head is at each K, K = drafts per round = 1, 3, 5, 7 (capped by
    block_size - 1): one server per K in the block mode, rows pooled over the rounds, the
    schedule derived from them and written with the mode it was measured in."""
    import json

    from eaglenest.models.heads.registry import HEADS
    from eaglenest.workers.jobs.options import for_kind, parse_options

    kind = "dflash"
    opts = for_kind(parse_options({"EAGLENEST_HEAD": kind, "EAGLENEST_DFLASH_BLOCK_SIZE": "8",
                                   "EAGLENEST_BENCH_CONCURRENCY": "1,4"}), kind)
    commands: dict[str, list[str]] = {}
    real_server = bench_stage._server

    def server(plan, head, k, log_path, sharing):  # noqa: ANN001
        commands[log_path.stem] = real_server(plan, head, k, log_path, sharing).spec.command()
        return FakeServer(log_path.stem)

    # tok/s: the baseline 100; at 1 running every 2 drafts more add 10 (K=7 best), at 4
    # running K=3 is best and K=5, 7 lose to the baseline
    rates = {1: {1: 110.0, 3: 120.0, 5: 130.0, 7: 140.0},
             4: {1: 104.0, 3: 112.0, 5: 99.0, 7: 90.0}}

    def measure(srv, plan, c):  # noqa: ANN001
        k = int(srv.name.split("-k")[1].split("-")[0]) if "-k" in srv.name else 0
        return result(c, 2, rates[c][k] if k else 100.0)

    monkeypatch.setattr(bench_stage, "_server", server)
    monkeypatch.setattr(bench_stage, "_measure", measure)
    head = tmp_path / "head"
    head.mkdir()
    plan = BenchPlan(Path("model"), head, ["p"] * 4, "embedded", opts.concurrency, 8,
                     opts.num_speculative_tokens, mode=HEADS[kind].default_mode,
                     ks=opts.measured_ks(), schedule_dir=head, rounds=opts.bench_rounds)
    report = bench_stage.run_benchmark(plan, tmp_path, lambda: False)
    assert list(report["results"]) == ["baseline"] + [f"eagle K={k}" for k in (1, 3, 5, 7)]
    assert "--head" not in commands["baseline-server"]
    for k in (1, 3, 5, 7):
        cmd = commands[f"eagle-k{k}-server"]
        assert cmd[cmd.index("--mode") + 1] == "block"
        assert cmd[cmd.index("--num-speculative-tokens") + 1] == str(k)
    doc = json.loads((head / "speculation_schedule.json").read_text())
    assert doc["mode"] == "block" and doc["measured"]["ks"] == [1, 3, 5, 7]
    assert doc["measured"]["chosen"] == {"1": 7, "4": 3}
    assert doc["thresholds"] == [[1, 7], [4, 3]]
    assert report["speedup"] == {"1": 1.4, "4": 0.9}  # the job's K: 7
    assert "| 1 | 100.0 | 110.0 | 120.0 | 130.0 | **140.0** | K=7 |" in (
        tmp_path / "benchmark.md").read_text()
