"""The console's benchmark figures (api/console/figures.py) from a job's report: the rows in
the order measured, the chosen row per level (a name, or "off"), the schedule in words with
its decodings; a report from before decodings were scheduled (a K per level, rows
"eagle K=n", 2-element thresholds) still reads."""

from __future__ import annotations

from eaglenest.api.console.figures import benchmark, schedule_text


def report(chosen: dict, rates: dict, thresholds: list, rows: list | None = None) -> dict:
    measured = {"chosen": chosen, "output_throughput": rates, **({"rows": rows} if rows else {})}
    return {"backend": "embedded", "schedule": {"thresholds": thresholds, "measured": measured}}


def test_a_report_with_decodings() -> None:
    rates = {"tree K=5": {"1": 150.0, "4": 90.0}, "baseline": {"1": 100.0, "4": 200.0},
             "chain K=3": {"1": 120.0, "4": 210.0}}
    figures = benchmark(report({"1": "tree K=5", "4": "chain K=3"}, rates,
                               [[1, 5, "tree"], [4, 3, "chain"]],
                               ["baseline", "chain K=3", "tree K=5"]))
    assert figures is not None
    assert figures["rows"] == ["baseline", "chain K=3", "tree K=5"]
    assert [(r["concurrency"], r["values"], r["chosen"]) for r in figures["table"]] == [
        (1, [100.0, 120.0, 150.0], "tree K=5"), (4, [200.0, 210.0, 90.0], "chain K=3")]
    assert figures["schedule"] == "tree K=5 at 1 running, chain K=3 from 2"
    assert schedule_text([[1, 4, "tree"], [4, 3, "chain"], [16, 0]]) == (
        "tree K=4 at 1 running, chain K=3 at 2-4, off from 5")
    assert schedule_text([[1, 5], "junk", [4, "x"]]) == "K=5 at every load"


def test_a_report_from_before_decodings() -> None:
    rates = {"eagle K=3": {"1": 150.0, "2": 160.0}, "baseline": {"1": 100.0, "2": 180.0}}
    figures = benchmark(report({"1": 3, "2": 0}, rates, [[1, 3], [2, 0]]))
    assert figures is not None and figures["rows"] == ["baseline", "eagle K=3"]
    assert [r["chosen"] for r in figures["table"]] == ["eagle K=3", "off"]
    assert figures["schedule"] == "K=3 at 1 running, off from 2"
