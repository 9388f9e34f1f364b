"""The figures behind the charts: a job's training curve and benchmark, an endpoint's
last hour of metrics. Everything read here was written by the worker or the runtime
proxy; a value of the wrong type is left out rather than failing the page.

- Training curve: the job row's `progress["curve"]`, a list of {"step", "loss",
  "train_acc": [acc@1, acc@2, acc@3], "held_out_acc": [...] | null, "time"} (at most 200
  points, written by the worker with its progress reports).
- Benchmark: the finished job's `output["Benchmark"]` (workers/jobs/bench_stage.py
  run_benchmark's report): `schedule.measured.output_throughput` is tok/s per row
  ("baseline", "chain K=3", "tree K=4", ...) per concurrency, pooled over the rounds;
  `schedule.measured.chosen` the row the schedule picked per concurrency ("off": the
  baseline; reports from before decodings were scheduled hold a K there, 0 for off, and
  name their rows "eagle K=n"); `schedule.thresholds` the schedule itself.
- Endpoint: db/metrics_repo.statistics() per variant over the last hour, per minute:
  AWS/SageMaker Invocations (Sum), ModelLatency (p50 and p99, microseconds, drawn in ms)
  and EagleNest/Endpoints AcceptedTokensPerRound (Average: tau).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from eaglenest.api.console.charts import Chart, Series, line_chart
from eaglenest.db import metrics_repo

HOUR = 3600
PERIOD = 60


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def _acc_series(curve: list[dict[str, Any]], key: str, label: str, dashed: bool
                ) -> list[Series]:
    out = []
    for depth in range(3):
        pts = []
        for p in curve:
            accs, step = p.get(key), _num(p.get("step"))
            value = _num(accs[depth]) if isinstance(accs, list) and len(accs) > depth else None
            if step is not None and value is not None:
                pts.append((step, value))
        out.append(Series(f"{label} acc@{depth + 1}", pts, dashed=dashed))
    return out


def training(progress: dict[str, Any]) -> list[Chart]:
    """Loss, and train / held-out acc@1..3, against the step."""
    raw = progress.get("curve")
    curve = [p for p in raw if isinstance(p, dict)] if isinstance(raw, list) else []
    loss = [(s, v) for s, v in ((_num(p.get("step")), _num(p.get("loss"))) for p in curve)
            if s is not None and v is not None]
    accuracy = [*_acc_series(curve, "train_acc", "train", False),
                *_acc_series(curve, "held_out_acc", "held-out", True)]
    colors = ("#2563eb", "#16a34a", "#d97706") * 2
    accuracy = [Series(s.name, s.points, s.dashed, colors[i]) for i, s in enumerate(accuracy)]
    return [line_chart("chart-loss", "Training loss", [Series("loss", loss)], "step", "loss"),
            line_chart("chart-accuracy", "Draft accuracy (dashed: held-out)", accuracy,
                       "step", "accuracy")]


def _rates(bench: dict[str, Any]) -> dict[str, dict[int, float]]:
    measured = ((bench.get("schedule") or {}).get("measured") or {})
    table = measured.get("output_throughput")
    out: dict[str, dict[int, float]] = {}
    if isinstance(table, dict):
        for row, levels in table.items():
            if isinstance(levels, dict):
                values = {str(c): _num(v) for c, v in levels.items()}
                out[str(row)] = {int(c): v for c, v in values.items()
                                 if c.isdigit() and v is not None}
    return out


def benchmark(bench: Any) -> dict[str, Any] | None:
    """The benchmark chart, its table and the chosen schedule; None before it exists (or
    when the job was stopped during it: its report is then empty)."""
    if not isinstance(bench, dict) or not bench:
        return None
    rates = _rates(bench)
    schedule = bench.get("schedule")
    schedule = schedule if isinstance(schedule, dict) else {}
    measured = schedule.get("measured")
    measured = measured if isinstance(measured, dict) else {}
    chosen_raw = measured.get("chosen")
    chosen_raw = chosen_raw if isinstance(chosen_raw, dict) else {}
    chosen = {int(c): _pick(k) for c, k in chosen_raw.items()
              if str(c).isdigit() and isinstance(k, int | str)}
    levels = sorted({c for row in rates.values() for c in row})
    rows = _order(measured.get("rows"), rates)
    rings = []
    for c, pick in sorted(chosen.items()):
        row = "baseline" if pick == "off" else pick
        if c in rates.get(row, {}):
            rings.append((float(c), rates[row][c], f"schedule at {c}: {row}"))
    chart = line_chart(
        "chart-benchmark", "Output tok/s against concurrency (ringed: the schedule's pick)",
        [Series(r, [(float(c), rates[r][c]) for c in levels if c in rates[r]]) for r in rows],
        "concurrency", "output tok/s", categories=[float(c) for c in levels], rings=rings)
    table = [{"concurrency": c, "values": [rates[r].get(c) for r in rows],
              "chosen": chosen.get(c, "-")} for c in levels]
    thresholds = schedule.get("thresholds")
    thresholds = thresholds if isinstance(thresholds, list) else []
    return {"chart": chart, "rows": rows, "table": table, "backend": bench.get("backend", ""),
            "schedule": schedule_text(thresholds)}


def _order(listed: Any, rates: dict[str, dict[int, float]]) -> list[str]:
    """The rows in the order measured (``measured.rows``: the baseline, then each decoding's
    rows by K); a report without that list: the baseline first, then by name."""
    if isinstance(listed, list):
        ordered = [r for r in listed if isinstance(r, str) and r in rates]
        return ordered + sorted(set(rates) - set(ordered))
    return sorted(rates, key=lambda r: (r != "baseline", len(r), r))


def _pick(value: int | str) -> str:
    """A `chosen` entry as a row name or "off": a K of an older report -> "eagle K=n"."""
    if isinstance(value, str):
        return value
    return f"eagle K={value}" if value else "off"


def _entry(t: Any) -> tuple[int, str] | None:
    """A threshold [max_running, K] or [max_running, K, "decoding"] -> (max_running, what
    it serves: "tree K=4", "K=5" (the server's own decoding) or "off"); None if malformed."""
    if not (isinstance(t, list) and len(t) in (2, 3)
            and all(isinstance(x, int) for x in t[:2])):
        return None
    decoding = t[2] if len(t) == 3 and isinstance(t[2], str) else None
    k = int(t[1])
    return int(t[0]), "off" if not k else f"{decoding} K={k}" if decoding else f"K={k}"


def schedule_text(thresholds: list[Any]) -> str:
    """A schedule in words, as the job's benchmark.md says it (workers/jobs/bench_report.py
    `describe`): [[1, 4, "tree"], [4, 3, "chain"], [16, 0]] -> "tree K=4 at 1 running,
    chain K=3 at 2-4, off from 5"; [[1, 5]] -> "K=5 at every load"."""
    entries = [e for e in map(_entry, thresholds) if e is not None]
    if not entries:
        return ""
    if len(entries) == 1:
        return f"{entries[0][1]} at every load"
    parts, start = [], 1
    for i, (most, what) in enumerate(entries):
        span = (f"from {start}" if i == len(entries) - 1 else
                f"at {start}" if start == most else f"at {start}-{most}")
        parts.append(f"{what} {span}" + (" running" if i == 0 else ""))
        start = most + 1
    return ", ".join(parts)


def _clock(t: float) -> str:
    return time.strftime("%H:%M", time.gmtime(t))


def _series(s: Session, account_id: str, namespace: str, metric: str, endpoint: str,
            variant: str, start: float, end: float, percentiles: Sequence[float] = ()
            ) -> list[metrics_repo.Stat]:
    dims = (("EndpointName", endpoint), ("VariantName", variant))
    return metrics_repo.statistics(s, account_id, namespace, metric, dims, start, end, PERIOD,
                                   percentiles=percentiles)


def endpoint_metrics(s: Session, account_id: str, endpoint: str, variants: list[str],
                     now: float) -> dict[str, Any]:
    """The endpoint's charts over the last hour and its invocation count in that hour."""
    end = (now // PERIOD + 1) * PERIOD
    start = end - HOUR
    inv, lat, tau = [], [], []
    total = 0.0
    for v in variants:
        calls = _series(s, account_id, "AWS/SageMaker", "Invocations", endpoint, v, start, end)
        total += sum(st.sum for st in calls)
        inv.append(Series(v, [(st.start, st.sum) for st in calls]))
        latency = _series(s, account_id, "AWS/SageMaker", "ModelLatency", endpoint, v, start,
                          end, (50.0, 99.0))
        for p, dashed in ((50.0, False), (99.0, True)):
            lat.append(Series(f"{v} p{int(p)}", [(st.start, st.percentiles[p] / 1000)
                                                 for st in latency if p in st.percentiles],
                              dashed))
        rounds = _series(s, account_id, "EagleNest/Endpoints", "AcceptedTokensPerRound",
                         endpoint, v, start, end)
        tau.append(Series(v, [(st.start, st.sum / st.sample_count) for st in rounds
                              if st.sample_count]))
    def timeline(chart_id: str, title: str, series: list[Series], unit: str) -> Chart:
        return line_chart(chart_id, title, series, "time (UTC)", unit, x_range=(start, end),
                          x_format=_clock, x_step=600.0)

    return {"invocations": int(total), "charts": [
        timeline("chart-invocations", "Invocations per minute", inv, "invocations"),
        timeline("chart-latency", "Model latency, ms (p50; dashed: p99)", lat, "ms"),
        timeline("chart-tau", "Accepted tokens per round (tau)", tau, "tokens")]}
