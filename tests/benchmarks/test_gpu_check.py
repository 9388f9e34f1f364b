"""scripts/gpu_check.sh end to end on the CPU with the tiny target (--device cpu --tiny): the
same code the GPU run takes, minus the sizes. Seconds on a 2-core CPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = {"training", "lossless", "verify_cost", "throughput", "service"}
RACE_ROWS = ["hf generate", "plain", "EAGLE-3 chain K=5", "P-EAGLE parallel K=5"]
MODES = {"plain", "chain", "tree", "parallel"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    from eaglenest.models.tiny import build_tiny_target

    out = tmp_path_factory.mktemp("gpu_check")
    race_target = build_tiny_target(tmp_path_factory.mktemp("race") / "tiny-llama",
                                    "LlamaForCausalLM")
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("OUT", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", "--tiny", "--out", str(out),
         "--race-target", str(race_target)],
        # about 4 minutes beside the other test process on 2 cores (its service job
        # regenerates 42 answers first): room for a busier box
        cwd=out, env=env, capture_output=True, text=True, timeout=600,
    )
    return proc, out


@pytest.fixture(scope="module")
def doc(tiny_run: tuple[subprocess.CompletedProcess, Path]) -> dict[str, Any]:
    proc, out = tiny_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads((out / "gpu_check.json").read_text())


def tiny(doc: dict[str, Any], section: str) -> dict[str, Any]:
    entry = doc["sections"][section]["tiny"]
    assert entry["status"] == "ok", entry.get("traceback")
    assert entry["seconds"] > 0
    return entry


def test_every_section_ran(doc: dict[str, Any]) -> None:
    assert set(doc["sections"]) == SECTIONS | {"race"}
    for section in SECTIONS:
        tiny(doc, section)
    assert doc["sections"]["race"]["tiny-llama"]["status"] == "ok"
    assert doc["ok"] is True and doc["problems"] == []
    env = doc["environment"]
    assert env["device"] == "cpu" and env["torch"] and env["transformers"]


def test_greedy_is_lossless_in_fp32(doc: dict[str, Any]) -> None:
    entry = tiny(doc, "lossless")
    assert entry["fp32_lossless"] is True
    assert set(entry["fp32"]) == MODES and set(entry["bf16"]) == MODES
    n = len(entry["prompt_lengths"])
    for mode, row in entry["fp32"].items():
        assert row["equal"] is True and row["divergent"] == 0 and row["sequences"] == n, mode
    for row in entry["bf16"].values():  # reported, not required
        assert 0 <= row["divergent"] <= row["sequences"] == n
        assert len(row["first_divergence"]) == row["divergent"]


def test_training_steps_per_second(doc: dict[str, Any]) -> None:
    entry = tiny(doc, "training")
    assert {h["head"] for h in entry["heads"]} == {"eagle3", "peagle"}
    for head in entry["heads"]:
        assert head["steps_per_s"] > 0 and head["tokens_per_s"] > 0
        assert head["loss_finite"] and math.isfinite(head["loss"])
        assert head["steps"] == entry["warmup_steps"] + entry["timed_steps"] + 1
    assert entry["capture_ms"] > 0


def test_verification_cost_curve_and_ceiling(doc: dict[str, Any]) -> None:
    entry = tiny(doc, "verify_cost")
    counts = entry["token_counts"]
    assert {1, 2, 4, 8, 16, 32, 64} <= set(counts)
    assert [point["n"] for point in entry["curve"]] == counts  # one entry per token count
    assert all(point["ms"] > 0 for point in entry["curve"])
    assert "tau * t_target(1)" in entry["formula"]
    assert {row["drafting"] for row in entry["ceiling"]} == {"verify_only", "chain", "parallel"}
    for row in entry["ceiling"]:
        assert set(row["speedup"]) == {"2", "3", "4"} and all(v > 0 for v in row["speedup"].values())
        assert row["t_draft_ms"] == 0 if row["drafting"] == "verify_only" else row["t_draft_ms"] > 0


def test_throughput_rows(doc: dict[str, Any]) -> None:
    rows = {row["name"]: row for row in tiny(doc, "throughput")["rows"]}
    assert {"hf generate", "ours plain"} <= set(rows) and len(rows) == 5
    assert all(row["tokens_per_s"] > 0 for row in rows.values())
    assert rows["hf generate"]["speedup_vs_hf"] == 1.0
    oracle = next(row for name, row in rows.items() if name.endswith("oracle"))
    assert oracle["tau"] > 3  # drafts read from the target's own output are accepted
    # fp32: every engine row emitted exactly what plain decoding did in its last timed run
    assert all(row["equal_to_plain"] is True for name, row in rows.items() if name != "hf generate")
    assert tiny(doc, "throughput")["rounds"] == 1


def test_head_race(doc: dict[str, Any]) -> None:
    """Both kinds trained on the same regenerated data for the same minutes, then decoded on
    the held-out prompts: every row emits plain decoding's tokens (fp32), the head rows count
    rounds and acceptance per position (tau from the same counts)."""
    entry = doc["sections"]["race"]["tiny-llama"]
    assert entry["status"] == "ok", entry.get("traceback")
    assert [h["head"] for h in entry["heads"]] == ["eagle3", "peagle"]
    for head in entry["heads"]:
        assert head["steps"] > 0 and head["tokens_per_s"] > 0 and math.isfinite(head["loss"])
        assert head["seconds"] >= 60 * entry["minutes_per_head"] * 0.5  # the budget was spent
    assert entry["samples"] == 8  # 4 examples x (greedy + sampled answer)
    assert entry["prompts"] == 2 and entry["loss_tokens"] > 0
    rows = {r["name"]: r for r in entry["rows"]}
    assert list(rows) == RACE_ROWS
    assert all(r["equal_to_plain"] == 2 and r["tokens"] > 0 for r in rows.values())
    assert rows["hf generate"]["speedup_vs_hf"] == 1.0 and rows["plain"]["tau"] is None
    for name in RACE_ROWS[2:]:
        row = rows[name]
        accepted = row["accepted_per_position"]
        assert len(accepted) == entry["k"] and row["tau"] == pytest.approx(1 + sum(accepted))
        assert all(a >= b for a, b in zip(accepted, accepted[1:], strict=False))  # prefixes


def test_markdown_table(tiny_run: tuple[subprocess.CompletedProcess, Path],
                        doc: dict[str, Any]) -> None:
    proc, out = tiny_run
    text = (out / "gpu_check.md").read_text()
    assert "| section | model | status | seconds | error / reason |" in text
    assert "| tiny | fp32 | chain | 2 | 0 | True |" in text
    assert text.strip() in proc.stdout  # printed as well
    assert "tiny lossless: ok in" in proc.stdout  # timestamped progress lines
    assert "### Head race on tiny-llama (float32)" in text
    assert "| P-EAGLE parallel K=5 |" in text


def test_help() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--tiny" in proc.stdout and "--out" in proc.stdout


def test_a_failing_section_is_recorded_and_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One section raising: its error is in the JSON, the other sections still run, exit 1."""
    import torch

    from benchmarks.gpu_check import __main__ as cli

    def broken(bench: object) -> dict:
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setitem(cli.SECTIONS, "training", broken)
    threads = torch.get_num_threads()
    try:
        rc = cli.main(["--device", "cpu", "--tiny", "--sections", "training,verify_cost",
                       "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rc == 1 and doc["ok"] is False
    training = doc["sections"]["training"]["tiny"]
    assert training["status"] == "error" and "simulated" in training["error"]
    assert doc["sections"]["verify_cost"]["tiny"]["status"] == "ok"
    assert doc["sections"]["lossless"] == {}  # not asked for
    assert "simulated" in (tmp_path / "gpu_check.md").read_text()


def test_a_bf16_run_adds_exact_fp32_oracle_rows() -> None:
    """Where the timed dtype is bf16 (CUDA), HF / plain / oracle rows in fp32 follow: the
    oracle there is accepted in full and emits what plain decoding does."""
    from dataclasses import dataclass

    import torch

    from benchmarks.gpu_check.build import SPECS, Bench
    from benchmarks.gpu_check.measure import throughput

    @dataclass
    class Bf16Bench(Bench):
        @property
        def perf_dtype(self) -> torch.dtype:
            return torch.bfloat16

    torch.manual_seed(0)
    entry = throughput(Bf16Bench(SPECS["tiny"], torch.device("cpu")))
    rows = {row["name"]: row for row in entry["rows"]}
    exact = {name: row for name, row in rows.items() if row["dtype"] == "float32"}
    assert set(exact) == {"hf generate float32", "ours plain float32",
                          "ours chain K=5 oracle float32"}
    assert {row["dtype"] for name, row in rows.items() if name not in exact} == {"bfloat16"}
    assert len(rows) == 8 and entry["dtype"] == "bfloat16"
    oracle = exact["ours chain K=5 oracle float32"]
    assert oracle["tau"] > 3 and oracle["equal_to_plain"] is True
    assert exact["hf generate float32"]["speedup_vs_hf"] == 1.0
    assert rows["hf generate"]["speedup_vs_hf"] == 1.0


def test_the_service_ran_a_job_and_an_endpoint(doc: dict[str, Any]) -> None:
    """eaglenest up, a job of ml.g5.2xlarge and an endpoint of its output model: on a CPU
    host (no GPU anywhere) the GPU type runs on the CPU, and nvidia-smi has nothing to say."""
    entry = tiny(doc, "service")
    assert entry["ok"] is True and entry["type"] == "ml.g5.2xlarge"
    assert entry["job"]["status"] == "COMPLETED" and entry["job"]["seconds"] > 0
    assert entry["job"]["gpus_held"] == []  # no GPU on this host: nothing held
    ep = entry["endpoint"]
    assert ep["generated_chars"] > 0 and ep["server_pid"] > 0
    assert ep["held_after_delete"] == []
    assert ep["on_gpu_per_nvidia_smi"] is None and ep["gone_after_delete"] is None
