"""Decode modes and what each one means to the engines (torch-free).

``DecodeMode`` names the modes (CLI ``--mode``, ``EAGLENEST_DECODE_MODE``, the embedded
server); ``DecodeMode.spec`` says how the engines run a round in that mode, so the engines
switch on a mode's traits rather than on its name:

    plain     no drafts: one target token per forward (the reference decoder)
    chain     K drafts, one head step each, verified as a sequence
    tree      an EAGLE-2 dynamic tree of a given depth, verified in one tree-masked forward
    parallel  K drafts from ONE head forward (P-EAGLE mask slots), verified as a sequence
    block     K drafts from ONE non-causal block forward of a block head (DFlash: anchor
              token + K mask slots over the target's injected context), verified as a chain
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


@dataclass(frozen=True)
class ModeSpec:
    drafts: bool  # a head (or drafter) proposes tokens each round
    tree: bool  # K is the depth of a draft tree; a round verifies its nodes
    parallel: bool  # one head forward drafts all K (needs a parallel head: HeadSpec.parallel)
    #: one block forward drafts all K (needs a block head: HeadSpec.block)
    block: bool
    #: smallest K adaptive depth may choose: 0 lets a round be plain (sequence modes only)
    adaptive_k_min: int
    #: largest K adaptive depth may choose (parallel: one head forward for any K, so deeper)
    adaptive_k_max: int


class DecodeMode(StrEnum):
    PLAIN = "plain"
    CHAIN = "chain"
    TREE = "tree"
    PARALLEL = "parallel"
    BLOCK = "block"

    @property
    def spec(self) -> ModeSpec:
        return MODES[self]


MODES: dict[DecodeMode, ModeSpec] = {
    DecodeMode.PLAIN: ModeSpec(drafts=False, tree=False, parallel=False, block=False,
                               adaptive_k_min=0, adaptive_k_max=0),
    DecodeMode.CHAIN: ModeSpec(drafts=True, tree=False, parallel=False, block=False,
                               adaptive_k_min=0, adaptive_k_max=8),
    DecodeMode.TREE: ModeSpec(drafts=True, tree=True, parallel=False, block=False,
                              adaptive_k_min=1, adaptive_k_max=8),
    DecodeMode.PARALLEL: ModeSpec(drafts=True, tree=False, parallel=True, block=False,
                                  adaptive_k_min=0, adaptive_k_max=12),
    # a block forward costs the same for any K up to block_size - 1
    DecodeMode.BLOCK: ModeSpec(drafts=True, tree=False, parallel=False, block=True,
                               adaptive_k_min=0, adaptive_k_max=15),
}

#: the modes a server or CLI may be asked for (plain is what no head means)
SPECULATIVE_MODES: tuple[str, ...] = tuple(m.value for m in DecodeMode if m.spec.drafts)


class HeadTraits(Protocol):
    """The HeadSpec flags (models/heads/registry.py) a mode needs of a head."""

    @property
    def title(self) -> str: ...
    @property
    def parallel(self) -> bool: ...
    @property
    def block(self) -> bool: ...


def refusal(mode: DecodeMode, head: HeadTraits) -> str | None:
    """Why ``head`` cannot draft in ``mode`` (None: it can; plain needs no head).

    A parallel mode needs a head with mask slots; a block mode needs a block head, and a
    block head drafts in block mode only (it has no causal draft step for chain, tree or
    parallel rounds). Example: (PARALLEL, EAGLE-3) -> "parallel drafting needs a head
    with mask slots (HeadSpec.parallel); EAGLE-3 heads have none"."""
    spec = mode.spec
    if not spec.drafts:
        return None
    if spec.parallel and not head.parallel:
        return (f"{mode.value} drafting needs a head with mask slots (HeadSpec.parallel); "
                f"{head.title} heads have none")
    if spec.block and not head.block:
        return (f"{mode.value} drafting needs a block-drafting head (HeadSpec.block); "
                f"{head.title} heads draft one token per step")
    if head.block and not spec.block:
        block_modes = ", ".join(m.value for m in DecodeMode if m.spec.block)
        return (f"{head.title} heads draft a block per forward: {mode.value} drafting is not "
                f"theirs (use {block_modes})")
    return None


ADAPTIVE_SUFFIX = "+adaptive"


@dataclass(frozen=True)
class Decoding:
    """How a speculative round drafts: a drafting mode, and whether the AdaptiveDepth
    controller (models/decode/adaptive.py) chooses its K each round (at most the K asked
    for). Written ``"chain"``, ``"tree"``, ``"parallel"``, ``"block"``, or with the suffix
    ``"+adaptive"``: ``"tree+adaptive"`` is an EAGLE-2 tree whose depth the controller
    chooses. K keeps its mode's meaning (chain / parallel drafts, tree depth, block length
    minus one)."""

    mode: DecodeMode  # a drafting mode (never PLAIN)
    adaptive: bool = False

    def __post_init__(self) -> None:
        if not self.mode.spec.drafts:
            raise ValueError(f"{self.mode.value} decoding drafts nothing: a decoding needs a "
                             f"drafting mode ({', '.join(SPECULATIVE_MODES)})")

    @property
    def name(self) -> str:
        """Example: Decoding(DecodeMode.CHAIN, adaptive=True).name == "chain+adaptive"."""
        return self.mode.value + (ADAPTIVE_SUFFIX if self.adaptive else "")

    @classmethod
    def parse(cls, name: str) -> Decoding:
        """The decoding written ``name``; ValueError listing the valid names otherwise."""
        base, adaptive = name, name.endswith(ADAPTIVE_SUFFIX)
        if adaptive:
            base = name[: -len(ADAPTIVE_SUFFIX)]
        if base not in SPECULATIVE_MODES:
            raise ValueError(f"unknown decoding {name!r}; valid: {', '.join(DECODINGS)}")
        return cls(DecodeMode(base), adaptive)


#: every decoding name, e.g. "chain", "chain+adaptive", "tree", ...
DECODINGS: tuple[str, ...] = tuple(f"{m}{s}" for m in SPECULATIVE_MODES
                                   for s in ("", ADAPTIVE_SUFFIX))


def schedule_refusal(names: Iterable[str], head: HeadTraits) -> str | None:
    """Why ``head`` cannot run one of the decodings a speculation schedule names (the
    first such), None when it can run them all. Example: (["tree", "parallel"], EAGLE-3)
    -> "the speculation schedule's decoding 'parallel' does not suit the head: parallel
    drafting needs a head with mask slots (HeadSpec.parallel); EAGLE-3 heads have none"."""
    for name in names:
        reason = refusal(Decoding.parse(name).mode, head)
        if reason is not None:
            return f"the speculation schedule's decoding {name!r} does not suit the head: {reason}"
    return None
