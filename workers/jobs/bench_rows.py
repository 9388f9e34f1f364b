"""Which rows the benchmark stage measures, and in how many rounds (workers/jobs/bench_stage.py).

Rows: "baseline" (the target alone) and one per (decoding, K), named ``f"{decoding} K={k}"``
(a models/decode/modes.py Decoding name): the plan's first decoding at every measured K, the
others at the largest (`plan_rows`). Example: decodings ("chain", "tree", "chain+adaptive"),
K 1, 3, 5 -> baseline, chain K=1, chain K=3, chain K=5, tree K=5, chain+adaptive K=5.

Rounds: a round measures every row once at a level, and each measurement sends every
held-out prompt the same number of times, at least one request per slot
(`requests_per_round`), so the rounds are alike and the spread between them measures the
host, not the prompt mix. A row's spread at a level is (max - min) / mean of its per-round
output tok/s (`spread`, reported). More rounds never narrow that range, but they do steady
the pooled figure the schedule compares, so sizing reads `pooled_spread`: twice the
standard error of the rounds' mean over the mean, which is the spread itself with two
rounds and shrinks as 1/sqrt(rounds) while the rounds scatter alike. Example: 95, 105 ->
10% (both); 95, 105, 100, 100 -> spread 10%, pooled 4.1%.
Sizing (`Sizing.more`): at least ``rounds`` rounds at each level, every level's before any
level's extra ones; then, lowest concurrency first, one more at a level while a watched
row's pooled spread there is SPREAD or more, up to ``max_rounds``, and only where the round
(priced at that level's last round) fits the stage's budget. The watched
rows (`watched`) are the figures the level's choice and its ratio rest on: the leading row
(`leading`: the one the schedule's own rule picks at that level alone,
workers/model_servers/schedule.py ``derive``: the highest mean among the rows that beat the
baseline by more than MARGIN in every round, else the baseline), the baseline it is
compared with, and the fastest speculative row by mean (the one steadier rounds could still
make the leading row, or take the lead from). Example: baseline 100, 100; chain K=3 104, 120
(mean 112, not leading: 104 is within 5%); tree K=5 90, 90 -> watched baseline and chain
K=3, and chain K=3's 14.3% spread asks for a round more although the baseline leads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from eaglenest.workers.model_servers.schedule import derive

BASELINE = "baseline"
#: more rounds at a level while a watched row's pooled spread is this or more
SPREAD = 0.05


class Row(NamedTuple):
    """A speculative row: ``decoding`` (a Decoding name) drafting ``k`` tokens a round."""

    decoding: str
    k: int

    @property
    def name(self) -> str:
        """Example: Row("tree", 4).name == "tree K=4"."""
        return f"{self.decoding} K={self.k}"

    @property
    def log_stem(self) -> str:
        """Its server's log file name: Row("chain+adaptive", 5) -> "chain-adaptive-k5-server"."""
        return f"{self.decoding.replace('+', '-')}-k{self.k}-server"


def plan_rows(decodings: Sequence[str], ks: Sequence[int]) -> tuple[Row, ...]:
    """The first decoding at every K of ``ks`` (ascending), the others at the largest."""
    first, *others = decodings
    ks = sorted(ks)
    return (*(Row(first, k) for k in ks), *(Row(d, ks[-1]) for d in others))


def requests_per_round(prompts: int, c: int) -> int:
    """One row's requests at concurrency ``c`` in one round: every prompt once, or as many
    times each as it takes to give every slot one request. Example: 8 prompts: c = 1..8
    -> 8, c = 12 -> 16, c = 16 -> 16."""
    prompts = max(prompts, 1)
    return prompts * math.ceil(c / prompts)


def spread(rates: Sequence[float]) -> float:
    """(max - min) / mean of one row's per-round rates; 0 for fewer than 2 rounds (no
    spread measured) or a mean of 0. Example: [95, 105] -> 0.1."""
    mean = sum(rates) / len(rates) if rates else 0.0
    if len(rates) < 2 or mean <= 0:
        return 0.0
    return (max(rates) - min(rates)) / mean


def pooled_spread(rates: Sequence[float]) -> float:
    """2 * standard error of the mean / mean (module docstring); 0 for fewer than 2 rounds
    or a mean of 0. Example: [95, 105] -> 0.1; [95, 105, 100, 100] -> 0.041."""
    n = len(rates)
    mean = sum(rates) / n if n else 0.0
    if n < 2 or mean <= 0:
        return 0.0
    sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / (n - 1))
    return 2 * sd / math.sqrt(n) / mean


def leading(rates: Mapping[str, Sequence[float]], rows: Sequence[Row]) -> str:
    """The leading row's name at one level, from each row's per-round rates there
    (``rates[BASELINE]`` the baseline's): what ``derive`` chooses at that level alone, or
    the baseline."""
    level = 1  # any key: derive sees one level
    _, chosen = derive({level: list(rates[BASELINE])},
                       {(r.decoding, r.k): {level: list(rates[r.name])} for r in rows
                        if rates.get(r.name)})
    decoding, k = chosen[level]
    return Row(decoding, k).name if k else BASELINE


def watched(rates: Mapping[str, Sequence[float]], rows: Sequence[Row]) -> list[str]:
    """The rows whose pooled figures a level is sized on (module docstring), leading row
    first: the leading row, the baseline, the fastest measured speculative row by mean
    (each once)."""
    means = {r.name: sum(v) / len(v) for r in rows if (v := rates.get(r.name))}
    names = [leading(rates, rows), BASELINE]
    if means:
        names.append(max(means, key=lambda n: means[n]))
    return list(dict.fromkeys(names))


def unsteadiest(rates: Mapping[str, Sequence[float]], rows: Sequence[Row]) -> tuple[str, float]:
    """The watched row with the largest pooled spread, and that spread (the leading row's
    when none spreads more)."""
    spreads = [(name, pooled_spread(rates.get(name, ()))) for name in watched(rates, rows)]
    return max(spreads, key=lambda s: s[1])


@dataclass
class Sizing:
    """How many rounds each level gets (module docstring); ``clock`` is the stage's, read
    from ``started`` (the stage's start) against ``budget_s`` (0: no budget)."""

    rounds: int
    max_rounds: int
    budget_s: float
    clock: Callable[[], float]
    started: float

    def more(self, done: int, rates: Mapping[str, Sequence[float]], rows: Sequence[Row],
             seconds: float) -> tuple[str, float] | None:
        """After ``done`` rounds at a level with these per-round ``rates``: (the unsteadiest
        watched row, its pooled spread) when one more round is due, which would take
        ``seconds``; None when the level is done. The first ``rounds`` are always due
        (spread 0 before two)."""
        name, wobble = unsteadiest(rates, rows) if done else (BASELINE, 0.0)
        if done < self.rounds:
            return name, wobble
        if done >= max(self.rounds, self.max_rounds) or wobble < SPREAD:
            return None
        return (name, wobble) if self.affords(seconds) else None

    def affords(self, seconds: float) -> bool:
        used = self.clock() - self.started
        return self.budget_s <= 0 or used + seconds <= self.budget_s

