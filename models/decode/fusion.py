"""Sibling projections run as one linear: an attention's q/k/v, an MLP's gate/up.

At decode shapes (one to a few dozen rows) a linear's cost has a fixed part besides its
matrix (the call, the kernel's threads joining); the three projections of one input pay it
three times, and the narrow ones (k, v) split poorly over threads. ``fuse_siblings``
replaces each group of ``SIBLINGS`` in a target's decoder layers by one linear over the
concatenated weights, built by the kernel candidate the chooser picked for them, and puts a
``SiblingSlice`` in each sibling's place:

* the direct forward (models/decode/direct.py) calls ``Siblings.split(x)`` once;
* transformers' own forward (``direct=False``, the benchmarks' side-by-side rows) still
  calls ``q_proj(x)``, ``k_proj(x)``, ``v_proj(x)``: the first call computes the fused
  product and keeps it until every sibling has taken its part, so a sibling called with
  that same tensor (unchanged since: its version counter) costs a slice. Called with
  another tensor it computes the product again (correct, only slower): fusion is applied
  only to ``direct.DIRECT_MODEL_TYPES``, whose layers give the siblings one input.

Memory: the fused weight replaces the siblings' (fusion happens only where the candidate
builds a new weight anyway, ``Candidate.repacks``; fusing stock linears would copy weights
the caller's original model still holds).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")
SIBLINGS: tuple[tuple[str, tuple[str, ...]], ...] = (("self_attn", QKV), ("mlp", GATE_UP))

Build = Callable[[nn.Linear], nn.Module]
_QUALIFIED = re.compile(r"^(model\.layers\.\d+\.(\w+))\.(\w+)$")  # owner path, owner, leaf


class Siblings(nn.Module):
    """One linear computing several projections of the same input: ``split(x)`` is
    ``(x @ W_1^T, x @ W_2^T, ...)`` as views of the fused product."""

    def __init__(self, fused: nn.Module, sizes: list[int]) -> None:
        super().__init__()
        self.fused = fused
        self.sizes = sizes
        # (input, its version, the parts, indices taken) of the last part() call
        self._kept: tuple[torch.Tensor, int, tuple[torch.Tensor, ...], set[int]] | None = None

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [..., in] -> [..., size_i]
        return tuple(self.fused(x).split(self.sizes, dim=-1))

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        kept = self._kept
        if kept is None or kept[0] is not x or kept[1] != x._version or index in kept[3]:
            kept = (x, x._version, self.split(x), set())
        kept[3].add(index)
        self._kept = None if len(kept[3]) == len(self.sizes) else kept  # all taken: let go
        return kept[2][index]


class SiblingSlice(nn.Module):
    """Stands in for one sibling projection: its part of the ``Siblings`` product."""

    def __init__(self, siblings: Siblings, index: int) -> None:
        super().__init__()
        self.siblings = siblings
        self.index = index
        self.out_features = siblings.sizes[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.siblings.part(x, self.index)


def fused_siblings(owner: nn.Module, names: tuple[str, ...]) -> Siblings | None:
    """The ``Siblings`` standing in for ``owner``'s ``names``, or None (not fused)."""
    first = getattr(owner, names[0], None)
    return first.siblings if isinstance(first, SiblingSlice) else None


def fuse_siblings(model: nn.Module, build_for: Callable[[str], Build | None]) -> set[str]:
    """Fuse the sibling groups of ``model``'s decoder layers (``model.model.layers``) in
    place; returns the qualified names of the linears replaced. The caller fuses only a
    target of ``direct.DIRECT_MODEL_TYPES``. ``build_for(name)``: the build of the candidate
    chosen for that linear if it repacks, else None. A group is fused when its linears are
    plain ``nn.Linear`` with one input width, dtype and device, all or none with a bias, and
    the same build."""
    done: set[str] = set()
    layers: Any = model.get_submodule("model.layers")  # an nn.ModuleList
    for i, layer in enumerate(layers):
        for owner_name, names in SIBLINGS:
            owner = getattr(layer, owner_name, None)
            linears = [getattr(owner, n, None) for n in names]
            qualified = [f"model.layers.{i}.{owner_name}.{n}" for n in names]
            builds = {build_for(q) for q in qualified}
            build = builds.pop() if len(builds) == 1 else None
            group = [lin for lin in linears if type(lin) is nn.Linear]
            if build is None or len(group) != len(names) or not compatible(group):
                continue
            siblings = Siblings(build(concat(group)), [lin.out_features for lin in group])
            for k, name in enumerate(names):
                setattr(owner, name, SiblingSlice(siblings, k))
            done.update(qualified)
    return done


def sibling_groups(names: Iterable[str]) -> list[list[str]]:
    """The qualified linear names as ``fuse_siblings`` would group them: each complete
    sibling group of one decoder layer (in ``SIBLINGS`` order) is one entry, every other
    name an entry of its own. E.g. ``model.layers.0.self_attn.{q,k,v}_proj`` and
    ``model.layers.0.self_attn.o_proj`` -> ``[[q, k, v], [o]]`` (full names)."""
    leaves = dict(SIBLINGS)
    owners: dict[str, set[str]] = {}
    for name in names:
        m = _QUALIFIED.match(name)
        if m and m.group(3) in leaves.get(m.group(2), ()):
            owners.setdefault(m.group(1), set()).add(m.group(3))
    out: list[list[str]] = []
    done: set[str] = set()
    for name in names:
        m = _QUALIFIED.match(name)
        group = leaves.get(m.group(2), ()) if m else ()
        if m and m.group(3) in group and owners[m.group(1)] >= set(group):
            if m.group(1) not in done:
                done.add(m.group(1))
                out.append([f"{m.group(1)}.{leaf}" for leaf in group])
        else:
            out.append([name])
    return out


def compatible(linears: list[nn.Linear]) -> bool:
    w = linears[0].weight
    return all(
        lin.in_features == linears[0].in_features and lin.weight.dtype == w.dtype
        and lin.weight.device == w.device and (lin.bias is None) == (linears[0].bias is None)
        for lin in linears
    )


@torch.no_grad()
def concat(linears: list[nn.Linear]) -> nn.Linear:
    """One linear whose output is the linears' outputs side by side (a transient weight:
    the candidate's build packs it into its own)."""
    w = linears[0].weight
    out = sum(lin.out_features for lin in linears)
    fused = nn.Linear(linears[0].in_features, out, bias=linears[0].bias is not None,
                      device=w.device, dtype=w.dtype)
    fused.weight.copy_(torch.cat([lin.weight for lin in linears], dim=0))  # [out, in]
    if fused.bias is not None:
        fused.bias.copy_(torch.cat([lin.bias for lin in linears]))  # type: ignore[misc]
    return fused
