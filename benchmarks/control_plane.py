
"""Control-plane benchmark: EagleNest against moto_server, through boto3, in one run.

    python -m benchmarks.control_plane [--iterations N] [--repeats R] [--grow-to M]
                                       [--json PATH]

Part 1, throughput: each iteration is CreateModel + DescribeModel + ListModels(MaxResults=10),
run at 1 and 8 client threads (one boto3 client per thread, no retries, errors counted and
not retried) against a fresh EagleNest (`python -m eaglenest.cli up`, temp data dir) and a
fresh `moto_server`, both started here on free loopback ports. Runs are interleaved
(repeat x threads x server); moto is reset before each of its runs. The median over repeats
of requests/s and of p50/p95 per operation is reported, with the EagleNest/moto ratio.
Caveat: moto's ListModels ignores MaxResults and returns every model, so its list calls
get slower as a run creates models; the mean number of models per list answer is shown.

Part 2, ListModels flatness: a second fresh EagleNest grows to 100, 1,000 and --grow-to
models (the first 100 through boto3, the rest inserted straight into its SQLite database
with the project's own repository code while it runs); at each size ListModels is timed
through boto3: the first page (MaxResults=10), a page ~90% deep into a NextToken walk,
and the walk itself (mean ms per page). moto is timed at 100 and 1,000 (first
page only: it has no pagination), where its cost grows with the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import boto3
import httpx
from botocore.config import Config

from eaglenest.foundation.host.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
ACCESS_KEY = "AKIAEAGLENESTBENCH01"
SECRET_KEY = "bench-secret-key-0123456789abcdefghijklmn"
REGION = "us-east-1"
ACCOUNT = "123456789012"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/EagleNestBench"
OPS = ("create_model", "describe_model", "list_models")
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 90.0
LIST_CALLS = 50
MAX_ERROR_SAMPLES = 5


def make_client(url: str) -> Any:
    """One boto3 client on its own session (sessions are not thread-safe), no retries."""
    session = boto3.session.Session(
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name=REGION
    )
    config = Config(retries={"total_max_attempts": 1}, max_pool_connections=16,
                    connect_timeout=10, read_timeout=60)
    return session.client("sagemaker", endpoint_url=url, config=config)


def model_spec(name: str) -> dict[str, Any]:
    """CreateModel's members, as boto3 sends them and EagleNest stores them."""
    return {
        "ModelName": name,
        "ExecutionRoleArn": ROLE,
        "PrimaryContainer": {
            "Image": "vllm",
            "ModelDataSource": {"S3DataSource": {
                "S3Uri": f"s3://models/{name}/", "S3DataType": "S3Prefix",
                "CompressionType": "None"}},
        },
    }


# --------------------------------------------------------------------------- servers


@dataclass
class Server:
    """A server process started here, in its own session, with its log in `workdir`."""

    label: str
    workdir: Path
    instance: str = ""  # names its log and data dir; defaults to the label
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stem(self) -> str:
        return self.instance or self.label

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def ready_path(self) -> str:
        return "/"

    def start(self) -> None:
        with open(self.workdir / f"{self.stem}.log", "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), env=self.env(), cwd=ROOT, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited early: {self.log_tail()}")
            try:
                if httpx.get(self.url + self.ready_path(), timeout=1).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.label} not ready in {START_TIMEOUT_S:.0f} s: {self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM, wait; if it hangs, SIGKILL its whole process group (all ours)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"warning: {self.label} ignored SIGTERM; killing it", file=sys.stderr)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers (api, worker, redis): our group
        proc.wait()

    def last_exception(self) -> str | None:
        """The exception line of the last traceback in the server's log, if any."""
        lines = self.log_tail(1_000_000).splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
        if not starts:
            return None
        tail = [ln for ln in lines[starts[-1] + 1:] if ln.strip() and not ln[0].isspace()]
        return tail[0][:300] if tail else None

    def log_tail(self, chars: int = 3000) -> str:
        path = self.workdir / f"{self.stem}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


@dataclass
class EagleNest(Server):
    def command(self) -> list[str]:
        return [sys.executable, "-m", "eaglenest.cli", "up", "--port", str(self.port)]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLENEST_")}
        env.update(
            EAGLENEST_DATA_DIR=str(self.data_dir), EAGLENEST_ACCESS_KEY_ID=ACCESS_KEY,
            EAGLENEST_SECRET_ACCESS_KEY=SECRET_KEY, EAGLENEST_ACCOUNT_ID=ACCOUNT,
            EAGLENEST_REGION=REGION, PYTHONUNBUFFERED="1",
        )
        return env

    def ready_path(self) -> str:
        return "/ping"

    @property
    def data_dir(self) -> Path:
        return self.workdir / f"{self.stem}-data"

    @property
    def database_url(self) -> str:
        return f"sqlite:///{(self.data_dir / 'eaglenest.db').resolve()}"


@dataclass
class Moto(Server):
    def command(self) -> list[str]:
        exe = shutil.which("moto_server")
        if exe is None:
            raise RuntimeError("moto_server not found (pip install 'moto[server]')")
        return [exe, "-H", "127.0.0.1", "-p", str(self.port)]

    def ready_path(self) -> str:
        return "/moto-api/"

    def reset(self) -> None:
        httpx.post(self.url + "/moto-api/reset", timeout=30).raise_for_status()


ServerT = TypeVar("ServerT", bound=Server)


@contextlib.contextmanager
def running(server: ServerT) -> Iterator[ServerT]:
    try:
        server.start()
        yield server
    finally:
        server.stop()


# --------------------------------------------------------------------------- throughput


@dataclass
class Recorder:
    """What one client thread saw: latencies per op (ms), errors, list answer sizes."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op in OPS})
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OPS, 0))
    error_samples: list[str] = field(default_factory=list)
    listed: list[int] = field(default_factory=list)

    def call(self, op: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            result = fn(**kwargs)
        except Exception as exc:  # counted, never retried
            self.errors[op] += 1
            if len(self.error_samples) < MAX_ERROR_SAMPLES:
                text = " ".join(str(exc).split())
                self.error_samples.append(f"{op}: {type(exc).__name__}: {text}"[:300])
            return None
        self.latencies[op].append((time.perf_counter() - t0) * 1000)
        return result


def client_loop(client: Any, names: list[str], barrier: threading.Barrier,
                rec: Recorder) -> None:
    barrier.wait(timeout=120)
    for name in names:
        rec.call("create_model", client.create_model, **model_spec(name))
        rec.call("describe_model", client.describe_model, ModelName=name)
        out = rec.call("list_models", client.list_models, MaxResults=10)
        if out is not None:
            rec.listed.append(len(out["Models"]))


@dataclass
class RunResult:
    server: str
    threads: int
    iterations: int
    seconds: float
    requests: int
    rps: float
    p50_ms: dict[str, float]
    p95_ms: dict[str, float]
    errors: dict[str, int]
    error_samples: list[str]
    mean_models_per_list: float
    client_cpu_ms_per_req: float
    server_cpu_ms_per_req: float


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def split_names(tag: str, iterations: int, threads: int) -> list[list[str]]:
    """`iterations` unique model names dealt round-robin to `threads` threads."""
    names = [f"bench-{tag}-{i}" for i in range(iterations)]
    return [names[t::threads] for t in range(threads)]


def group_cpu_seconds(pgid: int) -> float:
    """CPU seconds (user + system) of every live process in process group `pgid`."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process is gone
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def start_threads(server: Server, threads: int, iterations: int,
                  tag: str) -> tuple[list[threading.Thread], list[Recorder], list[Any]]:
    clients = [make_client(server.url) for _ in range(threads)]
    for c in clients:  # warm: connection, botocore's lazy loading
        c.list_models(MaxResults=1)
    recs = [Recorder() for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)
    workers = [
        threading.Thread(target=client_loop, args=(c, names, barrier, r), daemon=True)
        for c, names, r in zip(clients, split_names(tag, iterations, threads), recs,
                               strict=True)
    ]
    for w in workers:
        w.start()
    barrier.wait(timeout=120)
    return workers, recs, clients


def run_once(server: Server, threads: int, iterations: int, tag: str) -> RunResult:
    assert server.proc is not None
    srv0, cli0 = group_cpu_seconds(server.proc.pid), time.process_time()
    workers, recs, clients = start_threads(server, threads, iterations, tag)
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - t0
    cpu = (time.process_time() - cli0, group_cpu_seconds(server.proc.pid) - srv0)
    for c in clients:
        c.close()
    return summarize(server.label, threads, iterations, seconds, recs, cpu)


def summarize(label: str, threads: int, iterations: int, seconds: float,
              recs: list[Recorder], cpu: tuple[float, float]) -> RunResult:
    """`cpu`: (client, server) CPU seconds of the run, warm-up calls included."""
    lat = {op: [x for r in recs for x in r.latencies[op]] for op in OPS}
    listed = [n for r in recs for n in r.listed]
    requests = iterations * len(OPS)
    return RunResult(
        server=label, threads=threads, iterations=iterations, seconds=seconds,
        requests=requests, rps=requests / seconds,
        p50_ms={op: percentile(lat[op], 0.50) for op in OPS},
        p95_ms={op: percentile(lat[op], 0.95) for op in OPS},
        errors={op: sum(r.errors[op] for r in recs) for op in OPS},
        error_samples=[s for r in recs for s in r.error_samples],
        mean_models_per_list=statistics.fmean(listed) if listed else float("nan"),
        client_cpu_ms_per_req=cpu[0] * 1000 / requests,
        server_cpu_ms_per_req=cpu[1] * 1000 / requests,
    )


@dataclass
class ThroughputRow:
    server: str
    threads: int
    rps: float
    p50_ms: dict[str, float]
    p95_ms: dict[str, float]
    errors: dict[str, int]
    mean_models_per_list: float
    client_cpu_ms_per_req: float
    server_cpu_ms_per_req: float
    runs: list[RunResult]


def median_row(runs: list[RunResult]) -> ThroughputRow:
    return ThroughputRow(
        server=runs[0].server, threads=runs[0].threads,
        rps=statistics.median(r.rps for r in runs),
        p50_ms={op: statistics.median(r.p50_ms[op] for r in runs) for op in OPS},
        p95_ms={op: statistics.median(r.p95_ms[op] for r in runs) for op in OPS},
        errors={op: sum(r.errors[op] for r in runs) for op in OPS},
        mean_models_per_list=statistics.median(r.mean_models_per_list for r in runs),
        client_cpu_ms_per_req=statistics.median(r.client_cpu_ms_per_req for r in runs),
        server_cpu_ms_per_req=statistics.median(r.server_cpu_ms_per_req for r in runs),
        runs=runs,
    )


def throughput_phase(servers: list[Server], thread_counts: list[int], iterations: int,
                     repeats: int) -> list[ThroughputRow]:
    runs: dict[tuple[str, int], list[RunResult]] = {}
    for rep in range(repeats):
        for threads in thread_counts:
            for server in servers:
                if isinstance(server, Moto):
                    server.reset()
                result = run_once(server, threads, iterations, f"r{rep}t{threads}")
                runs.setdefault((server.label, threads), []).append(result)
                errs = sum(result.errors.values())
                print(f"  repeat {rep + 1}/{repeats} {server.label:9s} {threads} thr: "
                      f"{result.rps:7.1f} req/s in {result.seconds:5.1f} s, {errs} errors",
                      flush=True)
    return [median_row(v) for v in runs.values()]


# --------------------------------------------------------------------------- flatness


def grow_eaglenest(server: EagleNest, client: Any, size: int, batch: int = 2000) -> None:
    """Grow the model table to `size`: the first 100 through boto3, the rest straight into
    the database with the project's own repository code (same rows CreateModel writes)."""
    from eaglenest.db import models_repo
    from eaglenest.db.session import Database
    from eaglenest.foundation.accounts import Account

    have = count_models(server)
    while have < min(size, 100):
        client.create_model(**model_spec(f"grow-{have}"))
        have += 1
    database = Database(server.database_url)
    account = Account(REGION, ACCOUNT)
    try:
        while have < size:
            todo = min(batch, size - have)
            with database.session() as s:
                for i in range(have, have + todo):
                    models_repo.create(s, account, model_spec(f"grow-{i}"))
            have += todo
    finally:
        database.dispose()


def count_models(server: EagleNest) -> int:
    import sqlite3

    path = server.data_dir / "eaglenest.db"
    with sqlite3.connect(path, timeout=30) as conn:
        return int(conn.execute("SELECT count(*) FROM models").fetchone()[0])


def time_calls(fn: Callable[[], Any], calls: int) -> float:
    """Median ms of `calls` calls (after one warm-up call)."""
    fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def deep_walk(client: Any, size: int, depth: float = 0.9) -> tuple[str | None, float]:
    """Walk ListModels (MaxResults=10, NextToken) through ~`depth` of the table; return the
    NextToken there and the mean ms per page of the walk."""
    token: str | None = None
    walked = 0
    t0 = time.perf_counter()
    for _ in range(max(1, int(size * depth) // 10)):
        kw: dict[str, Any] = {"MaxResults": 10, **({"NextToken": token} if token else {})}
        token = client.list_models(**kw).get("NextToken")
        walked += 1
        if token is None:
            break
    return token, (time.perf_counter() - t0) * 1000 / walked


@dataclass
class FlatPoint:
    server: str
    size: int
    first_page_ms: float
    deep_page_ms: float | None
    walk_ms_per_page: float | None
    models_returned: int


def measure_eaglenest(server: EagleNest, client: Any, size: int, calls: int) -> FlatPoint:
    first = time_calls(lambda: client.list_models(MaxResults=10), calls)
    token, walk_ms = deep_walk(client, size)
    deep = None
    if token is not None:
        deep = time_calls(lambda: client.list_models(MaxResults=10, NextToken=token), calls)
    returned = len(client.list_models(MaxResults=10)["Models"])
    return FlatPoint(server.label, size, first, deep, walk_ms, returned)


def measure_moto(server: Moto, client: Any, size: int, calls: int) -> FlatPoint:
    have = len(client.list_models()["Models"])
    for i in range(have, size):
        client.create_model(**model_spec(f"grow-{i}"))
    first = time_calls(lambda: client.list_models(MaxResults=10), calls)
    returned = len(client.list_models(MaxResults=10)["Models"])
    return FlatPoint(server.label, size, first, None, None, returned)


def flatness_phase(eaglenest: EagleNest, moto: Moto | None, sizes: list[int],
                   moto_sizes: list[int], calls: int) -> list[FlatPoint]:
    points: list[FlatPoint] = []
    client = make_client(eaglenest.url)
    for size in sizes:
        t0 = time.perf_counter()
        grow_eaglenest(eaglenest, client, size)
        grown = time.perf_counter() - t0
        points.append(measure_eaglenest(eaglenest, client, size, calls))
        print(f"  eaglenest at {size:>6} models (grown in {grown:4.1f} s): "
              f"{points[-1].first_page_ms:.2f} ms/list", flush=True)
    if moto is not None and moto_sizes:
        moto.reset()
        mclient = make_client(moto.url)
        for size in moto_sizes:
            points.append(measure_moto(moto, mclient, size, calls))
            print(f"  moto      at {size:>6} models: {points[-1].first_page_ms:.2f} ms/list",
                  flush=True)
    return points


# --------------------------------------------------------------------------- report


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_throughput(rows: list[ThroughputRow], iterations: int, repeats: int) -> None:
    print(f"\nThroughput: create+describe+list(MaxResults=10) x {iterations} iterations, "
          f"median of {repeats} repeats (errors: sum over repeats)")
    head = f"{'server':10s} {'thr':>3s} {'req/s':>8s}"
    for op in OPS:
        head += f" {op.split('_')[0] + ' p50/p95 ms':>21s}"
    print(head + f" {'errors':>7s} {'models/list':>11s} {'cpu ms/req cli/srv':>19s}")
    for r in rows:
        line = f"{r.server:10s} {r.threads:>3d} {r.rps:>8.1f}"
        for op in OPS:
            line += f" {f'{r.p50_ms[op]:.2f} / {r.p95_ms[op]:.2f}':>21s}"
        cpu = f"{r.client_cpu_ms_per_req:.2f} / {r.server_cpu_ms_per_req:.2f}"
        print(line + f" {sum(r.errors.values()):>7d} {r.mean_models_per_list:>11.1f} {cpu:>19s}")
    for threads, ratio in ratios(rows).items():
        verdict = "meets" if ratio >= 2 else "MISSES"
        print(f"EagleNest/moto at {threads} thread(s): {ratio:.2f}x ({verdict} the 2x goal)")
    print("caveat: moto's ListModels ignores MaxResults and returns every model (see "
          "models/list), so its list cost grows during each run; moto is reset per run.")
    for r in rows:
        samples = dict.fromkeys(s for run in r.runs for s in run.error_samples)
        for sample in list(samples)[:2]:  # distinct ones; all of them are in the JSON
            print(f"error sample ({r.server}, {r.threads} thr): {sample}")


def ratios(rows: list[ThroughputRow]) -> dict[int, float]:
    by = {(r.server, r.threads): r.rps for r in rows}
    return {t: by[("eaglenest", t)] / by[("moto", t)]
            for (s, t) in by if s == "eaglenest" and ("moto", t) in by}


def print_flatness(points: list[FlatPoint], calls: int) -> dict[str, float]:
    print(f"\nListModels(MaxResults=10) vs table size: ms per call, median of {calls}; "
          "deep = the page ~90% into a NextToken walk; walk = mean ms per page of that walk")
    print(f"{'server':10s} {'models':>7s} {'first page':>11s} {'deep page':>10s} "
          f"{'walk ms/page':>13s} {'returned':>9s}")
    for p in points:
        print(f"{p.server:10s} {p.size:>7d} {p.first_page_ms:>11.2f} "
              f"{fmt_ms(p.deep_page_ms):>10s} {fmt_ms(p.walk_ms_per_page):>13s} "
              f"{p.models_returned:>9d}")
    out: dict[str, float] = {}
    for label in ("eaglenest", "moto"):
        mine = sorted((p for p in points if p.server == label), key=lambda p: p.size)
        if len(mine) >= 2:
            lo, hi = mine[0], mine[-1]
            out[f"{label}_first_page_ratio_{hi.size}_over_{lo.size}"] = (
                hi.first_page_ms / lo.first_page_ms)
            print(f"{label}: first page at {hi.size} / at {lo.size}: "
                  f"{hi.first_page_ms / lo.first_page_ms:.2f}x", end="")
            if lo.deep_page_ms and hi.deep_page_ms:
                out[f"{label}_deep_page_ratio_{hi.size}_over_{lo.size}"] = (
                    hi.deep_page_ms / lo.deep_page_ms)
                print(f"; deep page: {hi.deep_page_ms / lo.deep_page_ms:.2f}x", end="")
            print()
    return out


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=200,
                   help="create+describe+list iterations per run, split over the threads")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", default="1,8", help="comma-separated client thread counts")
    p.add_argument("--grow-to", type=int, default=10_000)
    p.add_argument("--moto-sizes", default="100,1000",
                   help="table sizes to time moto's ListModels at ('' to skip)")
    p.add_argument("--list-calls", type=int, default=LIST_CALLS)
    p.add_argument("--json", type=Path, default=None, help="also write all figures here")
    args = p.parse_args(argv)
    if args.iterations < 1 or args.repeats < 1 or args.grow_to < 1:
        p.error("--iterations, --repeats and --grow-to must be positive")
    return args


def csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def flat_sizes(grow_to: int) -> list[int]:
    return sorted({s for s in (100, 1000, grow_to) if s <= grow_to})


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    threads = csv_ints(args.threads)
    print("starting eaglenest and moto_server ...", flush=True)
    with running(Moto("moto", workdir)) as moto:
        with running(EagleNest("eaglenest", workdir)) as eagle:
            print(f"throughput (eaglenest {eagle.url}, moto {moto.url}) ...", flush=True)
            rows = throughput_phase([eagle, moto], threads, args.iterations, args.repeats)
            server_errors = {srv.label: srv.last_exception() for srv in (eagle, moto)}
        print_throughput(rows, args.iterations, args.repeats)
        for label, exc in server_errors.items():
            if exc and any(sum(r.errors.values()) for r in rows if r.server == label):
                print(f"{label} log, last exception: {exc}")
        print("\nListModels flatness (a fresh eaglenest) ...", flush=True)
        with running(EagleNest("eaglenest", workdir, instance="eaglenest-flat")) as flat:
            points = flatness_phase(flat, moto, flat_sizes(args.grow_to),
                                    csv_ints(args.moto_sizes), args.list_calls)
    flat_ratios = print_flatness(points, args.list_calls)
    return {"throughput": [asdict(r) for r in rows], "ratios": ratios(rows),
            "list_models": [asdict(p) for p in points], "list_models_ratios": flat_ratios,
            "server_last_exception": server_errors}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop the servers
    started, load0 = time.monotonic(), os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, 1-min load average {load0:.2f} before start"
          + (" (busy machine: figures will be noisy)" if load0 > 0.5 else ""), flush=True)
    with tempfile.TemporaryDirectory(prefix="eaglenest-bench-") as tmp:
        try:
            report = run(args, Path(tmp))
        except KeyboardInterrupt:
            print("interrupted; servers stopped", file=sys.stderr)
            return 130
    report["runtime_s"] = time.monotonic() - started
    report["config"] = {k: str(v) for k, v in vars(args).items()}
    report["load_average_1min"] = {"before": load0, "after": os.getloadavg()[0]}
    print(f"\ntotal runtime {report['runtime_s']:.1f} s; 1-min load average "
          f"{load0:.2f} before, {report['load_average_1min']['after']:.2f} after")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
