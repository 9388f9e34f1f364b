"""The GPU check's results document as markdown tables."""

from __future__ import annotations

from typing import Any


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return "-" if v is None else str(v)

    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines + [""]


def _ok(sections: dict[str, dict[str, Any]], name: str) -> list[tuple[str, dict[str, Any]]]:
    return [(m, e) for m, e in sections.get(name, {}).items() if e.get("status") == "ok"]


def _status(sections: dict[str, dict[str, Any]]) -> list[str]:
    rows = [[name, model, e["status"], e.get("seconds", 0.0),
             (e.get("error") or e.get("reason") or "")[:120]]
            for name, per in sections.items() for model, e in per.items()]
    return _table(["section", "model", "status", "seconds", "error / reason"], rows)


def _training(sections: dict[str, dict[str, Any]]) -> list[str]:
    rows = [[m, h["head"], e["autocast"], h["steps_per_s"], h["tokens_per_s"], h["loss"],
             e["capture_ms"]] for m, e in _ok(sections, "training") for h in e["heads"]]
    return ["### Training (models.training.train, batch 2, captures cached; capture_ms: target "
            "forward per sample, first epoch)", "", *_table(
                ["model", "head", "autocast", "steps/s", "tokens/s", "loss", "capture ms"],
                rows)]


def _lossless(sections: dict[str, dict[str, Any]]) -> list[str]:
    rows = []
    for m, e in _ok(sections, "lossless"):
        for dtype in ("fp32", "bf16"):
            for mode, r in e[dtype].items():
                rows.append([m, dtype, mode, r["sequences"], r["divergent"], r["equal"],
                             r["tau"], r["first_divergence"] or "-"])
    return ["### Greedy engine vs HF generate (fp32 must be equal; bf16 reported)", "",
            *_table(["model", "dtype", "mode", "sequences", "divergent", "equal", "tau",
                     "first divergence"], rows)]


def _verify(sections: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    for m, e in _ok(sections, "verify_cost"):
        counts = e["token_counts"]
        ms = {c["n"]: c["ms"] for c in e["curve"]}
        out += [f"### Verification cost, {m} ({e['dtype']}, KV context {e['context']}), ms", ""]
        out += _table([f"n={n}" for n in counts], [[ms[n] for n in counts]])
        rows = [[r["drafting"], r["k"], r["t_draft_ms"], r["t_verify_ms"],
                 *(r["speedup"].get(str(t)) for t in (2, 3, 4))] for r in e["ceiling"]]
        out += _table(["drafting", "K", "t_draft ms", "t(K+1) ms", "tau=2", "tau=3", "tau=4"],
                      rows)
    return out


def _throughput(sections: dict[str, dict[str, Any]]) -> list[str]:
    rows = [[m, r.get("dtype", e["dtype"]), r["name"], r["tokens_per_s"], r["tau"],
             r["speedup_vs_hf"], r.get("equal_to_plain")]
            for m, e in _ok(sections, "throughput") for r in e["rows"]]
    rounds = {e.get("rounds") for _, e in _ok(sections, "throughput")}
    return ["### Batch-1 decoding (random heads; oracle = drafts read from the plain output; "
            f"median of {'/'.join(str(r) for r in sorted(rounds, key=str))} rounds, rows "
            "interleaved)", "",
            *_table(["model", "dtype", "row", "tokens/s", "tau", "x HF", "= plain"], rows)]


def _service(sections: dict[str, dict[str, Any]]) -> list[str]:
    rows = []
    for m, e in _ok(sections, "service"):
        job, ep = e.get("job", {}), e.get("endpoint", {})
        rows.append([m, e.get("type"), "; ".join(e.get("gpus", [])), e.get("up_seconds"),
                     job.get("status"), e.get("steps"), job.get("seconds"),
                     "; ".join(job.get("gpus_held", [])), ep.get("in_service_seconds"),
                     ep.get("invoke_seconds"), ep.get("on_gpu_per_nvidia_smi"),
                     ep.get("gone_after_delete"), not ep.get("held_after_delete")])
    return ["### The service on this host (eaglenest up, a job, an endpoint; seconds)", "",
            *_table(["model", "type", "host GPUs", "up", "job", "steps", "job s", "job held",
                     "InService s", "invoke s", "server on GPU", "gone after delete",
                     "GPU free after delete"], rows)]


def _race(sections: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    for m, e in _ok(sections, "race"):
        out += [f"### Head race on {m} ({e['dtype']}): each head {e['minutes_per_head']} min, "
                f"{e['samples']} samples ({e['loss_tokens']} loss tokens), {e['prompts']} "
                f"held-out prompts x {e['eval_tokens']} tokens, rows interleaved", ""]
        out += _table(["head", "steps", "train s", "train tok/s", "loss"],
                      [[h["head"], h["steps"], h["seconds"], h["tokens_per_s"], h["loss"]]
                       for h in e["heads"]])
        out += _table(["row", "tokens/s", "x HF", "tau", "accepted at positions 1..K",
                       "= plain"],
                      [[r["name"], r["tokens_per_s"], r["speedup_vs_hf"], r["tau"],
                        "/".join(f"{a:.2f}" for a in r["accepted_per_position"]) or None,
                        f"{r['equal_to_plain']}/{e['prompts']}"] for r in e["rows"]])
    return out


def _verdict(ok: bool | None) -> str:
    return "running (partial results)" if ok is None else "OK" if ok else "FAILED"


def markdown(doc: dict[str, Any]) -> str:
    env, sections = doc["environment"], doc["sections"]
    lines = [f"## GPU check: {env['device_name']} ({env['device']}), torch {env['torch']}, "
             f"transformers {env['transformers']}", "",
             f"Result: {_verdict(doc.get('ok'))} after {doc.get('total_seconds', 0.0):.0f}s", ""]
    lines += _status(sections)
    parts = {"training": _training, "lossless": _lossless, "verify_cost": _verify,
             "throughput": _throughput, "service": _service, "race": _race}
    for name, part in parts.items():
        if _ok(sections, name):  # sections that ran, not empty tables
            lines += part(sections)
    lines += [f"Ceiling: {doc['formula']}", ""]
    return "\n".join(lines)
