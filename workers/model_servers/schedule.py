"""The speculation schedule: which draft depth K to use at each load level (K = 0: off).
K is the tokens drafted per round in the head's mode (a block head's: its block length
minus one), so one schedule serves chain, parallel and block heads alike.

A schedule is a list of thresholds ``[[max_running, K], ...]`` with ascending ``max_running``:
with n requests running, K is the K of the first entry whose ``max_running >= n``, and the
last entry's K beyond it. Example ``[[1, 5], [4, 3], [16, 0]]``: K=5 alone, K=3 with 2-4
requests running, plain decoding from 5 on.

The optimization job derives it from its own benchmark (``derive``): at each measured
concurrency c, the K whose output tok/s is highest among those that beat the baseline's by
more than ``MARGIN`` in every measurement round, never deeper than the level below's (else
0; once off, off above); a load between two measured levels gets the K of the level above it.
It travels as ``speculation_schedule.json`` in the head's folder (the ``eagle_model``
channel) and as the container Environment entry ``EAGLENEST_SPECULATION_SCHEDULE`` (the
thresholds as compact JSON); both backends follow it (docs/speculation-schedule.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARGIN = 0.05  # speculation must beat the baseline by more than 5% to be chosen
FILE_NAME = "speculation_schedule.json"
SCHEDULE_ENV = "EAGLENEST_SPECULATION_SCHEDULE"
MAX_K = 64
MAX_ENTRIES = 64


class ScheduleError(ValueError):
    """A schedule that cannot be used; the message names where it came from."""


@dataclass(frozen=True)
class Schedule:
    thresholds: tuple[tuple[int, int], ...]

    def k_for(self, running: int) -> int:
        """K for ``running`` requests in flight (at least 1 is assumed)."""
        for max_running, k in self.thresholds:
            if running <= max_running:
                return k
        return self.thresholds[-1][1]

    @property
    def k_max(self) -> int:
        return max(k for _, k in self.thresholds)

    @property
    def speculates(self) -> bool:
        return self.k_max > 0

    @property
    def speculate_upto(self) -> int | None:
        """The most running requests at which it still speculates, when it turns off above
        them for good (its last entry's K is 0); else None. Example: [[2, 3], [16, 0]] -> 2;
        [[1, 5], [4, 3]] -> None (on at every load); [[4, 0]] -> None (never on)."""
        if self.thresholds[-1][1] != 0 or not self.speculates:
            return None
        return max(m for m, k in self.thresholds if k > 0)

    def to_list(self) -> list[list[int]]:
        return [[m, k] for m, k in self.thresholds]

    def to_env(self) -> str:
        return json.dumps(self.to_list(), separators=(",", ":"))

    def vllm_ranges(self, top: int = 4096) -> list[list[int]]:
        """vLLM's ``num_speculative_tokens_per_batch_size``: inclusive batch-size ranges
        ``[start, end, K]`` from 1; the last range runs to ``top`` (vLLM clamps it to its
        max_num_seqs and carries the last K on)."""
        out, start = [], 1
        for i, (max_running, k) in enumerate(self.thresholds):
            end = max(top, max_running) if i == len(self.thresholds) - 1 else max_running
            out.append([start, end, k])
            start = max_running + 1
        return out


def schedule_from(value: Any, where: str) -> Schedule:
    """A Schedule from decoded JSON: a thresholds list, or an object holding one."""
    if isinstance(value, dict):
        value = value.get("thresholds")
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_ENTRIES:
        raise ScheduleError(f"{where} must be a list of 1 to {MAX_ENTRIES} [max_running, K] "
                            "pairs, e.g. [[1,5],[4,3],[16,0]]")
    pairs: list[tuple[int, int]] = []
    for entry in value:
        if (not isinstance(entry, list) or len(entry) != 2
                or not all(type(x) is int for x in entry)):
            raise ScheduleError(f"{where}: {json.dumps(entry)} is not a [max_running, K] pair "
                                "of integers")
        max_running, k = entry
        if max_running < 1 or not 0 <= k <= MAX_K:
            raise ScheduleError(f"{where}: {json.dumps(entry)} needs max_running >= 1 and "
                                f"0 <= K <= {MAX_K}")
        if pairs and max_running <= pairs[-1][0]:
            raise ScheduleError(f"{where}: max_running must increase from entry to entry "
                                f"({pairs[-1][0]} then {max_running})")
        pairs.append((max_running, k))
    return Schedule(tuple(pairs))


def parse_schedule(raw: str, where: str = SCHEDULE_ENV) -> Schedule:
    try:
        value = json.loads(raw)
    except ValueError:
        raise ScheduleError(f"{where}={raw[:80]!r} is not JSON; expected a list of "
                            "[max_running, K] pairs, e.g. [[1,5],[4,3],[16,0]]") from None
    return schedule_from(value, where)


def read_schedule(head_dir: Path | None) -> Schedule | None:
    """The schedule shipped in a head's folder, or None when it has none."""
    path = head_dir / FILE_NAME if head_dir else None
    if path is None or not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())
    except ValueError:
        raise ScheduleError(f"{FILE_NAME} in the eagle_model channel is not JSON") from None
    return schedule_from(value, FILE_NAME)


Rates = Mapping[int, float | Sequence[float]]  # concurrency -> tok/s, one per round


def _rounds(value: float | Sequence[float]) -> list[float]:
    return [float(value)] if isinstance(value, (int, float)) else [float(v) for v in value]


def _qualifies(rates: list[float], base: list[float], margin: float) -> bool:
    """Beats the baseline by more than ``margin`` in every round (round i against round i)."""
    pairs = list(zip(rates, base, strict=False))
    return bool(pairs) and all(r > b * (1 + margin) for r, b in pairs)


def derive(baseline: Rates, by_k: Mapping[int, Rates],
           margin: float = MARGIN) -> tuple[Schedule, dict[int, int]]:
    """(schedule, chosen K per measured concurrency) from output tok/s: ``baseline[c]`` and
    ``by_k[K][c]``, each one rate or one per measurement round (rounds paired by index).

    At each level, ascending: the K with the highest mean rate among those that beat the
    baseline by more than ``margin`` in every round and are no deeper than the level
    below's K; none: 0. So K never grows with load and, once off, stays off: a level where
    speculation wins only by chance above a level where it lost is not trusted.
    Example: baseline {1: 10, 4: 30, 8: 40}, K=3 {1: 18, 4: 31.2, 8: 48} -> {1: 3, 4: 0,
    8: 0} (31.2 is within the 5% margin; 48 at 8 is above a level that was off)
    -> thresholds [[1, 3], [8, 0]]. With two rounds, baseline {1: [10, 10]} and K=3
    {1: [18, 10.4]} -> 0 at 1: the second round's 10.4 is within 5% of its baseline's 10."""
    chosen: dict[int, int] = {}
    cap = MAX_K
    for c in sorted(baseline):
        base = _rounds(baseline[c])
        best_k, best = 0, 0.0
        for k in sorted(by_k):
            value = by_k[k].get(c)
            if value is None or k > cap:
                continue
            rates = _rounds(value)
            mean = sum(rates) / len(rates)
            if _qualifies(rates, base, margin) and mean > best:
                best_k, best = k, mean
        chosen[c] = cap = best_k
    if not chosen:
        raise ScheduleError("no measured concurrency level to derive a schedule from")
    pairs: list[tuple[int, int]] = []
    for c, k in chosen.items():  # ascending c; merge runs of one K into their last level
        if pairs and pairs[-1][1] == k:
            pairs[-1] = (c, k)
        else:
            pairs.append((c, k))
    return Schedule(tuple(pairs)), chosen
