"""An optimization job's stages as progress bars, from its row's `progress` record (what
the worker reports: workers/jobs/progress.py, workers/jobs/control.py) and its status.

The pipeline (workers/jobs/pipeline.py) runs its stages in this order, some only when the
job asks for them; each reports its label first ("download model", "train eagle3 head on
96 samples", "benchmark baseline vs EAGLE", ...), recognised here by its first word. A
record that lists the labels seen so far (`progress["stages"]`, each a label or a
{"stage": label} record) gives the stages exactly; without it the stages before the
current one in this order are shown done. Within a stage the record's own counters give
the fraction: training steps (or the used share of its time budget), capture shards,
benchmark requests; other stages are 0 until the next one begins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: (first word of the stage's label, what the console calls it), in pipeline order
ORDER: tuple[tuple[str, str], ...] = (
    ("download", "download model"), ("check", "check model files"), ("load", "load data"),
    ("regenerate", "regenerate replies"), ("capture", "capture hidden states"),
    ("train", "train head"), ("export", "export head"), ("benchmark", "benchmark"),
    ("upload", "upload outputs"),
)
#: stages every job runs (the others only when its options ask for them)
ALWAYS = ("download", "check", "load", "train", "export", "upload")
ACTIVE = ("STARTING", "INPROGRESS", "STOPPING")


@dataclass(frozen=True)
class Bar:
    key: str
    label: str
    percent: int  # 0..100
    state: str  # "done", "running", "pending", "stopped"
    detail: str = ""


def _key(label: str) -> str:
    """The stage a label names by its first word ("regenerated answers from the cache ..."
    is the regenerate stage); "" for none."""
    word = label.strip().split(" ", 1)[0].lower() if label.strip() else ""
    return next((k for k, _ in ORDER if word and word.startswith(k.rstrip("e"))), "")


def fraction(progress: dict[str, Any]) -> float:
    """How far the current stage is, 0..1, from the record's counters."""
    try:
        if "phase" in progress and progress.get("requests_total"):
            return float(progress["requests"]) / float(progress["requests_total"])
        if "shard" in progress and progress.get("shards"):
            return float(progress["shard"]) / float(progress["shards"])
        if "step" in progress and progress.get("total"):
            if progress.get("budget_seconds"):
                return max(float(progress["budget_used"]),
                           float(progress["step"]) / float(progress["total"]))
            return float(progress["step"]) / float(progress["total"])
    except (TypeError, ValueError, KeyError):
        return 0.0
    return 0.0


def _seen(progress: dict[str, Any]) -> list[str]:
    listed = progress.get("stages")
    if not isinstance(listed, list):
        return []
    labels = [x.get("stage", "") if isinstance(x, dict) else str(x) for x in listed]
    # one bar per stage: "train" and "train in 2 processes" are the same stage
    return list(dict.fromkeys(k for k in (_key(label) for label in labels) if k))


def _plan(current: str, seen: list[str], done: bool, ran: tuple[str, ...]) -> list[str]:
    """The stage keys shown, in order."""
    if seen:
        rest = [] if done else [k for k, _ in ORDER if k in ALWAYS and k not in seen
                                and _index(k) > _index(seen[-1])]
        return [*seen, *rest]
    return [k for k, _ in ORDER if k in ALWAYS or k == current or k in ran]


def _index(key: str) -> int:
    return [k for k, _ in ORDER].index(key)


def bars(status: str, progress: dict[str, Any] | None, ran: tuple[str, ...] = ()
         ) -> list[Bar]:
    """One bar per stage (module docstring); a COMPLETED job's are all full. `ran`: stages
    known to have run from elsewhere (the job's output holds a benchmark)."""
    progress = progress or {}
    current = _key(str(progress.get("stage", "")))
    done = status == "COMPLETED"
    names = dict(ORDER)
    out = []
    for key in _plan(current, _seen(progress), done, ran):
        if done or (current and _index(key) < _index(current)):
            out.append(Bar(key, names[key], 100, "done"))
        elif key == current:
            pct = int(100 * min(max(fraction(progress), 0.0), 1.0))
            state = "running" if status in ACTIVE else "stopped"
            out.append(Bar(key, names[key], pct, state, str(progress.get("stage", ""))))
        else:
            out.append(Bar(key, names[key], 0, "pending"))
    return out


def overall(status: str, progress: dict[str, Any] | None) -> int:
    """The job's bar, 0..100: the current stage's place in the pipeline's order plus its
    fraction, so it only grows while the job runs; 100 once COMPLETED."""
    if status == "COMPLETED":
        return 100
    progress = progress or {}
    current = _key(str(progress.get("stage", "")))
    if not current:
        return 0
    done = _index(current) + min(max(fraction(progress), 0.0), 1.0)
    return int(100 * done / len(ORDER))
