"""Speculative-decoding counters in vLLM's terms.

* num_drafts: verification rounds that carried drafts (vLLM spec_decode_num_drafts)
* num_draft_tokens: draft tokens sent to verification (tree: nodes besides the root)
* num_accepted_tokens: drafts the target accepted
* accepted_per_pos[j]: rounds whose draft at position (tree: depth) j + 1 was accepted
* acceptance length tau = 1 + accepted / drafts (tokens per target forward, bonus included)

Example: two rounds of K=3 accepting 2 and 0 drafts -> num_drafts 2, num_draft_tokens 6,
num_accepted_tokens 2, accepted_per_pos [1, 1, 0], tau = 1 + 2 / 2 = 2.0.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class SpecStats:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    num_emitted_tokens: int = 0  # tokens handed to the caller (prefill token included)
    num_target_forwards: int = 0  # prefill + one per decode step
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    elapsed_seconds: float = 0.0

    def record(self, drafted: int, accepted: int) -> None:
        """One verification round with ``drafted`` draft tokens, ``accepted`` of them kept."""
        if drafted <= 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        while len(self.accepted_per_pos) < max(drafted, accepted):
            self.accepted_per_pos.append(0)
        for j in range(accepted):
            self.accepted_per_pos[j] += 1

    @property
    def acceptance_length(self) -> float:
        """tau = 1 + accepted / drafts (1.0 before any draft)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.num_emitted_tokens / self.elapsed_seconds if self.elapsed_seconds else 0.0

    def merge(self, other: SpecStats) -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        while len(self.accepted_per_pos) < len(other.accepted_per_pos):
            self.accepted_per_pos.append(0)
        for j, n in enumerate(other.accepted_per_pos):
            self.accepted_per_pos[j] += n
        self.num_emitted_tokens += other.num_emitted_tokens
        self.num_target_forwards += other.num_target_forwards
        self.draft_seconds += other.draft_seconds
        self.verify_seconds += other.verify_seconds
        self.elapsed_seconds += other.elapsed_seconds

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["acceptance_length"] = self.acceptance_length
        out["acceptance_rate"] = self.acceptance_rate
        out["tokens_per_second"] = self.tokens_per_second
        return out
