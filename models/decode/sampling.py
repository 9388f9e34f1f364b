"""Target distributions and lossless verification rules (greedy and rejection sampling).

Every function returns ``(accepted, next_token)``: how many leading drafts are kept and the
token the target adds after them (the correction on a rejection, the bonus token when all
drafts pass). Greedy verification reproduces the target's own greedy output; the
sampling rules make the emitted token's distribution equal the target's ``p`` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., vocab] logits -> the distribution the target samples from (temperature, top-p).

    Top-p keeps the smallest prefix of the sorted distribution whose mass reaches top_p
    (a token is kept when the mass *before* it is < top_p). Example probs [0.5, 0.3, 0.2],
    top_p 0.7 -> mass before each: [0, 0.5, 0.8] -> keep the first two -> [0.625, 0.375, 0].
    """
    probs = torch.softmax(logits.float() / max(params.temperature, 1e-5), dim=-1)
    if params.top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each sorted token
    sorted_p = torch.where(before < params.top_p, sorted_p, torch.zeros_like(sorted_p))
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return kept / kept.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, gen: torch.Generator | None) -> int:
    """One draw from a [vocab] distribution."""
    return int(torch.multinomial(probs, 1, generator=gen))


def uniform(gen: torch.Generator | None) -> float:
    return float(torch.rand((), generator=gen))


def verify_greedy(logits: torch.Tensor, drafts: list[int]) -> tuple[int, int]:
    """logits [k + 1, vocab]: row j is the target's prediction after draft j (row 0 after
    the pending token). Accept the longest prefix where draft j == argmax(row j).

    Example argmax rows [5, 7, 9, 2], drafts [5, 7, 1] -> accepted 2, next token 9.
    """
    best = logits.argmax(-1).tolist()
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == best[accepted]:
        accepted += 1
    return accepted, best[accepted]


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)); falls back to p where the residual has no mass (p == q)."""
    r = torch.clamp(p - q, min=0.0)
    total = r.sum()
    return r / total if float(total) > 0 else p


def verify_rejection(
    p: torch.Tensor,  # [k + 1, vocab] target distributions (row j judges draft j)
    drafts: list[int],
    q: torch.Tensor | None,  # [k, vocab] draft distributions drafts were sampled from;
    # None = deterministic drafts (q is a point mass on each draft)
    gen: torch.Generator | None,
) -> tuple[int, int]:
    """Standard speculative sampling: accept draft j with prob min(1, p_j(x) / q_j(x)); on
    the first rejection emit a sample of norm(max(0, p_j - q_j)); if all pass, sample the
    bonus token from p_k. The emitted tokens are distributed exactly as the target's."""
    for j, x in enumerate(drafts):
        qx = 1.0 if q is None else float(q[j, x])
        px = float(p[j, x])
        if qx > 0 and uniform(gen) < min(1.0, px / qx):
            continue
        if q is None:
            q_row = torch.zeros_like(p[j])
            q_row[x] = 1.0
        else:
            q_row = q[j]
        return j, sample(residual(p[j], q_row), gen)
    return len(drafts), sample(p[len(drafts)], gen)


def verify_siblings(
    p: torch.Tensor,  # [vocab] target distribution at a tree node
    candidates: list[int],  # distinct deterministic child tokens, best first
    gen: torch.Generator | None,
) -> tuple[int, int]:
    """Multi-candidate rejection for deterministic (top-k) children.

    Child c is tried with q = point mass on c: accept with prob p(c); on rejection p
    becomes norm(max(0, p - q)), i.e. p with c zeroed and renormalised, and the next
    child is tried against it. Returns (index of the accepted child or -1, token): the token
    is the child's on acceptance, else a sample from the final residual, so the token is
    always distributed as the original p.
    """
    p = p.clone()
    for i, c in enumerate(candidates):
        if uniform(gen) < float(p[c]):
            return i, c
        p[c] = 0.0
        total = float(p.sum())
        if total <= 0:
            break
        p = p / total
    return -1, sample(p, gen)
