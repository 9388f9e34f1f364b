"""The benchmark report's parts read from the servers (workers/jobs/bench_report.py)."""

from __future__ import annotations

from eaglenest.workers.jobs.bench_report import server_kernels


def test_each_rows_kernels_come_from_its_servers_log(tmp_path):
    (tmp_path / "baseline-server.log").write_text(
        "INFO loading\n"
        "2026-11-30 00:47:11,708 INFO linear kernels: layers=stock (cached), lm_head=onednn\n"
        "INFO linear kernels: layers=onednn (measured), lm_head=onednn (measured)\n")
    (tmp_path / "chain-k3-server.log").write_text("INFO vLLM API server\n")  # no such line
    got = server_kernels(tmp_path, {"baseline": "baseline-server", "chain K=3": "chain-k3-server",
                                    "tree K=5": "tree-k5-server"})  # never started: no log
    assert got == {"baseline": "layers=onednn (measured), lm_head=onednn (measured)"}
