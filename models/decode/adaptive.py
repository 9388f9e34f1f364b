"""Online choice of the speculation depth K (chain / parallel) or tree depth.

The controller keeps exponentially decayed counts of the conditional acceptance at each
position, a_j = P(draft j accepted | drafts < j accepted), and moving averages of the
measured costs: one draft step, and a verification forward as a linear function of its
number of tokens, verify(n) = level * (1 + slope * (n - 1)). ``level`` follows every
measurement quickly (the context length changes it: a long prompt's forwards cost more at
every size); ``slope`` is learned slowly from consecutive rounds of different sizes (close in
time, so at nearly the same context), whose cost ratio r = verify(n2) / verify(n1) gives
slope = (r - 1) / ((n2 - 1) - r * (n1 - 1)). A table per size would mix the two: a size last
measured on a long prompt would look dear long after. For each candidate depth K it predicts

    tokens(K) = 1 + sum_{j=1..K} prod_{i<=j} a_i          (expected tokens per round)
    cost(K)   = forwards(K) * step + verify_cost(size(K)) + overhead   (seconds per round)

where ``forwards(K)`` counts the head forwards a round of K runs: the first draft comes from
the logits the head computed when the last round's tokens were committed (part of the
overhead), so a chain (or a tree of depth K) runs K - 1 head steps and parallel drafting
one forward over K - 1 mask slots for any K >= 2, none for K <= 1; block drafting (DFlash)
one block forward for any K >= 1 (no draft comes for free: the context commit computes no
logits). ``step`` is the measured seconds of one such forward (a parallel or block
forward's rows add little next to the target's).

(overhead: the rest of a round, committing accepted tokens to the head and emitting them,
measured by ``observe_round``) and picks the K with the best tokens(K) / cost(K).
Positions never reached reuse the deepest estimate, so the controller explores one step
beyond what it has seen when that looks worthwhile. With ``k_min = 0`` (chain and parallel
drafting) K = 0 is a candidate too: a plain round, tokens 1 at the cost of a one-token
verification, chosen when drafts stop paying (a batch that is already compute-bound, text
the head cannot predict). Plain rounds record no acceptance, so the decayed counts drift
back to the prior and the controller tries drafting again after a while (how long depends
on the costs).

Example: a = [0.9, 0.8, 0.5], draft step 5 ms, verify 100 ms flat ->
tokens(1..3) = 1.9, 2.62, 2.98; chain cost = 100, 105, 110 ms -> rates 19.0, 25.0, 27.1
tok/s -> K = 3 (and K = 4 is tried next if a_4 ~ 0.5 keeps paying). In parallel the same
a_j cost 100, 105, 105 ms: deeper rounds cost no more drafting, so parallel's K runs deeper
(its ModeSpec allows a larger ``adaptive_k_max``); block rounds cost 105, 105, 105 ms (one
block forward whatever K), so block's K runs as deep, up to the head's block_size - 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

MAX_SLOPE = 0.25  # per-token cost samples are clipped to +-25%: beyond is noise, not physics


@dataclass
class AdaptiveDepth:
    k_min: int = 1
    k_max: int = 8
    decay: float = 0.9  # per round: how fast old acceptance is forgotten
    prior_rate: float = 0.6  # prior conditional acceptance per position
    prior_weight: float = 2.0
    smoothing: float = 0.3  # EMA weight of a new cost measurement (draft step, level)
    slope_smoothing: float = 0.1  # EMA weight of a new slope observation
    parallel: bool = False  # P-EAGLE: one draft forward per round whatever K is
    block: bool = False  # DFlash: one block forward per round for any K >= 1
    accepted: list[float] = field(default_factory=list)  # decayed accepts at position j
    reached: list[float] = field(default_factory=list)  # decayed rounds reaching position j
    step_cost: float | None = None  # seconds per draft step
    level: float | None = None  # seconds of a one-token verification, now
    slope: float = 0.03  # extra cost per verified token, relative (prior: 3%)
    last_verify: tuple[int, float] | None = None  # (tokens, seconds) of the last round
    overhead: float = 0.0  # seconds per round outside drafting and verification
    _last_parts: float = 0.0  # drafting + verification seconds of the last update

    def rate(self, j: int) -> float:
        """Conditional acceptance at 0-based position j (beyond the data: the last one)."""
        if j >= len(self.reached):
            j = len(self.reached) - 1
        if j < 0:
            return self.prior_rate
        num = self.accepted[j] + self.prior_rate * self.prior_weight
        return num / (self.reached[j] + self.prior_weight)

    def forwards(self, k: int) -> int:
        """Head forwards a round of K drafts runs (chain and parallel: the first draft is
        already computed; block: every draft comes from the round's one block forward)."""
        if self.block:
            return 1 if k >= 1 else 0
        if self.parallel:
            return 1 if k >= 2 else 0
        return max(k - 1, 0)

    def expected_tokens(self, k: int) -> float:
        total, survive = 1.0, 1.0
        for j in range(k):
            survive *= self.rate(j)
            total += survive
        return total

    def verify_seconds(self, size: int) -> float:
        """Predicted seconds of a verification forward over ``size`` tokens."""
        return (self.level or 1.0) * (1.0 + max(self.slope, 0.0) * (size - 1))

    def new_context(self) -> None:
        """A new request starts: its first round is no slope sample against the last one's
        (different prompt lengths: the ratio would be the context's, not the size's)."""
        self.last_verify = None

    def _observe_verify(self, size: int, seconds: float) -> None:
        """Example: slope 0.03, last round 6 tokens in 45 ms, this one 11 tokens in 54 ms:
        r = 1.2 -> slope sample (1.2 - 1) / (10 - 1.2 * 5) = 0.05, weighted by the size gap
        (5 of 8 -> 0.1 * 5 / 8) -> slope 0.03125; level sample 54 / (1 + 0.03125 * 10) = 41.1
        ms. Samples are clipped to +-MAX_SLOPE (a one-token gap amplifies timing noise)."""
        if self.last_verify is not None and self.last_verify[0] != size:
            n1, t1 = self.last_verify
            r = seconds / max(t1, 1e-9)
            denom = (size - 1) - r * (n1 - 1)
            if abs(denom) > 1e-9:
                sample = min(max((r - 1) / denom, -MAX_SLOPE), MAX_SLOPE)
                weight = self.slope_smoothing * min(1.0, abs(size - n1) / 8)  # far apart: surer
                self.slope += weight * (sample - self.slope)
        slope = max(self.slope, 0.0)  # noisy samples may go below 0 (unbiased mean)
        base = seconds / (1.0 + slope * (size - 1))
        self.level = base if self.level is None else _ema(self.level, base, self)
        self.last_verify = (size, seconds)

    def update(
        self, k: int, accepted: int, draft_seconds: float, verify_seconds: float, size: int
    ) -> None:
        """Record one round: k drafts sent, ``accepted`` kept, and its measured costs."""
        self.accepted = [x * self.decay for x in self.accepted]
        self.reached = [x * self.decay for x in self.reached]
        while len(self.reached) < k:
            self.reached.append(0.0)
            self.accepted.append(0.0)
        for j in range(min(accepted + 1, k)):  # positions 0..accepted were judged
            self.reached[j] += 1.0
            if j < accepted:
                self.accepted[j] += 1.0
        forwards = self.forwards(k)
        if forwards:  # K <= 1 ran no head forward: it says nothing of the step cost
            step = draft_seconds / forwards
            self.step_cost = step if self.step_cost is None else _ema(self.step_cost, step, self)
        self._observe_verify(size, verify_seconds)
        self._last_parts = draft_seconds + verify_seconds

    def observe_round(self, seconds: float) -> None:
        """The whole round's seconds (after ``update``): what drafting and verification do
        not explain (committing the accepted tokens to the head, emitting) is a fixed cost
        per round, which makes deeper rounds relatively cheaper."""
        self.overhead = _ema(self.overhead, max(seconds - self._last_parts, 0.0), self)

    def choose(self, size_of: Callable[[int], int]) -> int:
        """Best K in [k_min, k_max]; ``size_of(K)`` is the verification size for K."""
        step = self.step_cost or 0.0
        best_k, best_rate = self.k_min, -1.0
        for k in range(self.k_min, self.k_max + 1):
            cost = self.forwards(k) * step + self.verify_seconds(size_of(k)) + self.overhead
            rate = self.expected_tokens(k) / max(cost, 1e-9)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k


def _ema(old: float, new: float, ctl: AdaptiveDepth) -> float:
    return (1 - ctl.smoothing) * old + ctl.smoothing * new
