"""The speculation schedule: which decoding and draft depth K to use at each load level
(K = 0: off). K is the tokens drafted per round in the decoding's mode (a tree's depth, a
block head's block length minus one), so one schedule serves chain, tree, parallel and block
decodings alike.

A schedule is a list of thresholds with ascending ``max_running``: ``[max_running, K]`` (the
server's own decoding) or ``[max_running, K, "decoding"]`` (K >= 1; a decoding name of
models/decode/modes.py ``Decoding``: "chain", "tree", "parallel", "block", optionally with
"+adaptive"). With n requests running, the first entry whose ``max_running >= n`` is in
force, and the last entry beyond it. Example ``[[1, 4, "tree"], [4, 3, "chain"], [16, 0]]``:
a depth-4 EAGLE-2 tree alone, chain K=3 with 2-4 requests running, plain decoding from 5 on.
Two-element schedules (those published before decodings were scheduled) stay valid.

The optimization job derives it from its own benchmark (``derive``): at each measured
concurrency c, the (decoding, K) row whose output tok/s is highest among those that beat the
baseline's by more than ``MARGIN`` in every measurement round, never deeper than the level
below's K (else off; once off, off above); a load between two measured levels gets the entry
of the level above it. It travels as ``speculation_schedule.json`` in the head's folder (the
``eagle_model`` channel) and as the container Environment entry
``EAGLENEST_SPECULATION_SCHEDULE`` (the thresholds as compact JSON); both backends follow its
K, the embedded server its decodings too (vLLM serves its one method: ``vllm_ranges``)
(docs/speculation-schedule.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from eaglenest.models.decode.modes import DECODINGS, Decoding

MARGIN = 0.05  # speculation must beat the baseline by more than 5% to be chosen
FILE_NAME = "speculation_schedule.json"
SCHEDULE_ENV = "EAGLENEST_SPECULATION_SCHEDULE"
MAX_K = 64
MAX_ENTRIES = 64
PLAIN = "plain"  # derive's chosen decoding where speculation is off (K = 0)
EXAMPLE = '[[1,4,"tree"],[4,3,"chain"],[16,0]]'


class ScheduleError(ValueError):
    """A schedule that cannot be used; the message names where it came from."""


class Threshold(NamedTuple):
    """One entry: up to ``max_running`` requests, K drafts in ``decoding`` (None: the
    server's own decoding; always None where K = 0)."""

    max_running: int
    k: int
    decoding: str | None = None


Entry = tuple[int, int] | tuple[int, int, str | None]  # (max_running, K[, decoding])


class Schedule:
    """Thresholds ascending by max_running (``schedule_from`` checks them); plain tuples
    given are made Thresholds, so ``Schedule(((1, 5), (16, 0)))`` equals the parsed
    ``[[1,5],[16,0]]``. Immutable: compared and hashed by its thresholds."""

    __slots__ = ("thresholds",)
    thresholds: tuple[Threshold, ...]

    def __init__(self, thresholds: Iterable[Entry]) -> None:
        object.__setattr__(self, "thresholds", tuple(Threshold(*t) for t in thresholds))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Schedule is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and self.thresholds == other.thresholds

    def __hash__(self) -> int:
        return hash(self.thresholds)

    def __repr__(self) -> str:
        return f"Schedule({self.to_env()})"

    def entry_for(self, running: int) -> Threshold:
        """The entry in force with ``running`` requests in flight (at least 1 is assumed)."""
        for entry in self.thresholds:
            if running <= entry.max_running:
                return entry
        return self.thresholds[-1]

    def k_for(self, running: int) -> int:
        """K for ``running`` requests in flight (at least 1 is assumed)."""
        return self.entry_for(running).k

    def decoding_for(self, running: int) -> str | None:
        """The decoding for ``running`` requests in flight; None: the server's own (or off)."""
        return self.entry_for(running).decoding

    @property
    def decodings(self) -> tuple[str, ...]:
        """The decodings its entries name, in order of first use, each once."""
        return tuple(dict.fromkeys(t.decoding for t in self.thresholds if t.decoding))

    @property
    def k_max(self) -> int:
        return max(t.k for t in self.thresholds)

    @property
    def speculates(self) -> bool:
        return self.k_max > 0

    @property
    def speculate_upto(self) -> int | None:
        """The most running requests at which it still speculates, when it turns off above
        them for good (its last entry's K is 0); else None. Example: [[2, 3], [16, 0]] -> 2;
        [[1, 5], [4, 3]] -> None (on at every load); [[4, 0]] -> None (never on)."""
        if self.thresholds[-1].k != 0 or not self.speculates:
            return None
        return max(t.max_running for t in self.thresholds if t.k > 0)

    def to_list(self) -> list[list[Any]]:
        """The JSON form: ``[max_running, K]``, or ``[max_running, K, decoding]`` where the
        entry names one."""
        return [[m, k, d] if d else [m, k] for m, k, d in self.thresholds]

    def to_env(self) -> str:
        return json.dumps(self.to_list(), separators=(",", ":"))

    def vllm_ranges(self, top: int = 4096) -> list[list[int]]:
        """vLLM's ``num_speculative_tokens_per_batch_size``: inclusive batch-size ranges
        ``[start, end, K]`` from 1; the last range runs to ``top`` (vLLM clamps it to its
        max_num_seqs and carries the last K on). Decodings are not vLLM's to switch: it
        drafts its one configured method at each range's K."""
        out, start = [], 1
        for i, (max_running, k, _) in enumerate(self.thresholds):
            end = max(top, max_running) if i == len(self.thresholds) - 1 else max_running
            out.append([start, end, k])
            start = max_running + 1
        return out


def _entry(entry: Any, where: str) -> Threshold:
    """One JSON entry checked: ``[max_running, K]`` or ``[max_running, K, decoding]``."""
    shown = json.dumps(entry)
    if (not isinstance(entry, list) or len(entry) not in (2, 3)
            or not all(type(x) is int for x in entry[:2])
            or (len(entry) == 3 and not isinstance(entry[2], str))):
        raise ScheduleError(f"{where}: {shown} is not a [max_running, K] pair of integers "
                            "or a [max_running, K, \"decoding\"] triple")
    max_running, k = entry[0], entry[1]
    if max_running < 1 or not 0 <= k <= MAX_K:
        raise ScheduleError(f"{where}: {shown} needs max_running >= 1 and 0 <= K <= {MAX_K}")
    decoding = entry[2] if len(entry) == 3 else None
    if decoding is not None:
        try:
            Decoding.parse(decoding)
        except ValueError:
            raise ScheduleError(f"{where}: {shown} names an unknown decoding {decoding!r}; "
                                f"valid: {', '.join(DECODINGS)}") from None
        if k == 0:
            raise ScheduleError(f"{where}: {shown} is off (K = 0) and so has no decoding: "
                                f"write [{max_running}, 0]")
    return Threshold(max_running, k, decoding)


def schedule_from(value: Any, where: str) -> Schedule:
    """A Schedule from decoded JSON: a thresholds list, or an object holding one."""
    if isinstance(value, dict):
        value = value.get("thresholds")
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_ENTRIES:
        raise ScheduleError(f"{where} must be a list of 1 to {MAX_ENTRIES} [max_running, K] "
                            f"or [max_running, K, \"decoding\"] entries, e.g. {EXAMPLE}")
    entries: list[Threshold] = []
    for raw in value:
        entry = _entry(raw, where)
        if entries and entry.max_running <= entries[-1].max_running:
            raise ScheduleError(f"{where}: max_running must increase from entry to entry "
                                f"({entries[-1].max_running} then {entry.max_running})")
        entries.append(entry)
    return Schedule(tuple(entries))


def parse_schedule(raw: str, where: str = SCHEDULE_ENV) -> Schedule:
    try:
        value = json.loads(raw)
    except ValueError:
        raise ScheduleError(f"{where}={raw[:80]!r} is not JSON; expected a list of "
                            f"[max_running, K(, decoding)] entries, e.g. {EXAMPLE}") from None
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


Row = tuple[str, int]  # (decoding name, K); ("plain", 0): speculation off


def _best_row(base: list[float], rows: Mapping[Row, Rates], c: int, cap: int,
              margin: float) -> Row:
    """The qualifying row with the highest mean rate at ``c`` among K <= cap (ties: the
    smaller K, then the name); none: ("plain", 0)."""
    best: Row = (PLAIN, 0)
    best_rate = 0.0
    for name, k in sorted(rows, key=lambda r: (r[1], r[0])):
        value = rows[name, k].get(c)
        if value is None or k > cap or k < 1:
            continue
        rates = _rounds(value)
        mean = sum(rates) / len(rates)
        if _qualifies(rates, base, margin) and mean > best_rate:
            best, best_rate = (name, k), mean
    return best


def derive(baseline: Rates, rows: Mapping[Row, Rates],
           margin: float = MARGIN) -> tuple[Schedule, dict[int, Row]]:
    """(schedule, chosen (decoding, K) per measured concurrency) from output tok/s:
    ``baseline[c]`` and ``rows[(decoding, K)][c]``, each one rate or one per measurement
    round (rounds paired by index).

    At each level, ascending: the row with the highest mean rate among those that beat the
    baseline by more than ``margin`` in every round and whose K is no deeper than the level
    below's chosen K; none: ("plain", 0). So K never grows with load and, once off, stays off:
    a level where speculation wins only by chance above a level where it lost is not
    trusted. Entries are ``[c, K, decoding]`` (K > 0) or ``[c, 0]``; runs of one (decoding,
    K) merge into their last level.
    Example: baseline {1: 10, 4: 30, 8: 40}, ("tree", 4) {1: 20, 4: 33, 8: 50},
    ("chain", 3) {1: 18, 4: 34, 8: 41.5} -> at 1 both beat 10.5, tree is faster: ("tree",
    4); at 4 both beat 31.5, chain is faster: ("chain", 3), so K <= 3 above; at 8 tree's 50
    is too deep (4 > 3) and chain's 41.5 is within 5% of 40: ("plain", 0) -> thresholds
    [[1, 4, "tree"], [4, 3, "chain"], [8, 0]]. With two rounds, baseline {1: [10, 10]} and
    ("chain", 3) {1: [18, 10.4]} -> ("plain", 0) at 1: the second round's 10.4 is within
    5% of its baseline's 10."""
    chosen: dict[int, Row] = {}
    cap = MAX_K
    for c in sorted(baseline):
        chosen[c] = _best_row(_rounds(baseline[c]), rows, c, cap, margin)
        cap = chosen[c][1]
    if not chosen:
        raise ScheduleError("no measured concurrency level to derive a schedule from")
    entries: list[Threshold] = []
    for c, (name, k) in chosen.items():  # ascending c; a run of one row merges into its last
        entry = Threshold(c, k, name if k else None)
        if entries and entries[-1][1:] == entry[1:]:
            entries[-1] = entry
        else:
            entries.append(entry)
    return Schedule(tuple(entries)), chosen
