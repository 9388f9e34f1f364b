"""EAGLE-2 dynamic draft tree: build (expand + rerank) and verify (greedy / sampling).

Build, for ``depth`` levels with branching ``topk``:

* level 1: the top-k tokens of the last committed head slot, score = log q(token);
* level d+1: the k frontier nodes of level d go through the head in ONE forward (each sees
  the committed slots plus its own ancestors: a tree mask over the head KV); each proposes
  its top-k children, score = parent score + log q(child); of the k*k children the k with
  the best cumulative score become the next frontier; all k*k are kept as candidates;
* rerank: the ``total_tokens - 1`` best candidates by cumulative score form the tree.
  Scores only fall along a path (log q <= 0) and candidates are listed level by level, so
  a stable descending sort puts every parent before its children: the chosen set is
  closed under ancestors and ``parents[i] < i`` holds in the sorted order.

Worked example (topk 2, depth 2, total_tokens 4; root r):
  level 1: a (-0.1), b (-2.0)                         frontier [a, b]
  level 2: a -> c (-0.1 - 0.2 = -0.3), d (-1.6);  b -> e (-2.5), f (-3.0)
  candidates [a, b, c, d, e, f], sorted [a(-0.1), c(-0.3), d(-1.6), b(-2.0), ...]
  tree = r + [a, c, d]: tokens [r, a, c, d], parents [-1, 0, 1, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglenest.models.decode.drafter import HeadDrafter
from eaglenest.models.decode.masks import children_of, path_to, tree_depths, tree_mask
from eaglenest.models.decode.sampling import verify_siblings


@dataclass
class DraftTree:
    tokens: list[int]  # [n] node 0 = root (the pending committed token)
    parents: list[int]  # [n] parents[0] = -1, parents[i] < i

    @property
    def depths(self) -> list[int]:
        return tree_depths(self.parents)

    @property
    def mask(self) -> torch.Tensor:
        return tree_mask(self.parents)


@dataclass
class _Node:
    token: int  # target id
    parent: int  # candidate index, -1 = root
    score: float  # cumulative log-prob
    level: int  # 1-based depth
    fed: int = -1  # index among fed tree slots in the head KV, -1 if never fed


@torch.no_grad()
def build_tree(
    drafter: HeadDrafter, root: int, depth: int, topk: int, total_tokens: int
) -> DraftTree:
    """Expand the top-k frontier for ``depth`` levels, rerank to ``total_tokens`` nodes."""
    assert drafter.last_logits is not None and drafter.last_out is not None
    drafter.crop()
    nodes: list[_Node] = []
    outs: list[torch.Tensor] = []  # head output of every fed node, [1, 1, hidden] each
    logp, ids = torch.log_softmax(drafter.last_logits.float(), -1).topk(topk)
    for lp, d in zip(logp.tolist(), ids.tolist(), strict=True):
        nodes.append(_Node(int(drafter.target_ids[d]), -1, min(lp, 0.0), 1))
    frontier = list(range(len(nodes)))
    for level in range(2, depth + 1):
        frontier = _expand(drafter, nodes, outs, frontier, level, topk)
    drafter.crop()
    order = sorted(range(len(nodes)), key=lambda i: -nodes[i].score)[: total_tokens - 1]
    index = {c: i + 1 for i, c in enumerate(order)}  # candidate -> tree node index
    tokens = [root] + [nodes[c].token for c in order]
    parents = [-1] + [index.get(nodes[c].parent, 0) for c in order]
    return DraftTree(tokens=tokens, parents=parents)


def _expand(
    drafter: HeadDrafter,
    nodes: list[_Node],
    outs: list[torch.Tensor],
    frontier: list[int],
    level: int,
    topk: int,
) -> list[int]:
    """Feed the frontier (one head forward), add k children each, return the next frontier.

    Head KV layout: [committed slots | fed tree nodes in feeding order]. The frontier node
    f gets fed index len(outs) + i; its mask row sees every committed slot, the fed
    ancestors of f and itself. Example: committed 3, fed so far [a, b] (level 1 is fed at
    level 2), frontier [c, d] both children of a, fed now ->
      c: [1, 1, 1,  1, 0,  1, 0]       d: [1, 1, 1,  1, 0,  0, 1]
    """
    device, root_out = drafter.device, drafter.last_out
    assert root_out is not None  # build_tree checked it
    base = len(outs)
    for i, f in enumerate(frontier):
        nodes[f].fed = base + i
    rows = []
    for f in frontier:
        row = torch.zeros(base + len(frontier), dtype=torch.bool)
        row[nodes[f].fed] = True
        p = nodes[f].parent
        while p >= 0:
            row[nodes[p].fed] = True
            p = nodes[p].parent
        rows.append(row)
    committed = torch.ones(len(frontier), drafter.slots, dtype=torch.bool)
    mask = torch.cat([committed, torch.stack(rows)], dim=1).to(device)
    # hidden input of f = head output of its parent slot (level 1: last committed slot)
    hidden = torch.cat(
        [
            root_out if nodes[f].parent < 0 else outs[nodes[nodes[f].parent].fed]
            for f in frontier
        ],
        dim=1,
    )  # [1, k, hidden]
    tokens = torch.tensor([nodes[f].token for f in frontier], device=device)
    positions = torch.full((len(frontier),), drafter.slots + level - 2, device=device)
    logits, out = drafter.step(tokens, hidden, positions, mask)
    outs.extend(out[:, i : i + 1] for i in range(len(frontier)))
    logp, ids = torch.log_softmax(logits.float(), -1).topk(topk)  # [k, topk] each
    children = []
    for i, f in enumerate(frontier):
        for lp, d in zip(logp[i].tolist(), ids[i].tolist(), strict=True):
            children.append(len(nodes))
            token = int(drafter.target_ids[d])
            nodes.append(_Node(token, f, nodes[f].score + min(lp, 0.0), level))
    children.sort(key=lambda c: -nodes[c].score)
    return children[:topk]


def walk_greedy(tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """Follow the target's argmax down the tree.

    logits [n, vocab] row i = target prediction after node i. Returns (accepted node path
    excluding the root, next token). Example tokens [r, a, c, d], parents [-1, 0, 1, 1],
    argmax rows [a, d, x, y] -> path [1, 3] (a then d), next token y.
    """
    best = logits.argmax(-1).tolist()
    kids = children_of(tree.parents)
    node, path = 0, list[int]()
    while True:
        match = [c for c in kids[node] if tree.tokens[c] == best[node]]
        if not match:
            return path, best[node]
        node = match[0]
        path.append(node)


def walk_sampling(
    tree: DraftTree, probs: torch.Tensor, gen: torch.Generator | None
) -> tuple[list[int], int]:
    """Sampling walk: at each node try its children (best first) with ``verify_siblings``
    against the node's target distribution probs[node]; stop at the first node where all
    children are rejected (or a leaf) and emit the residual sample there."""
    kids = children_of(tree.parents)
    node, path = 0, list[int]()
    while True:
        cands = kids[node]
        idx, token = verify_siblings(probs[node], [tree.tokens[c] for c in cands], gen)
        if idx < 0:
            return path, token
        node = cands[idx]
        path.append(node)


def accepted_path(tree: DraftTree, path: list[int]) -> list[int]:
    """Root plus accepted nodes, as indices (the rows whose KV entries are kept)."""
    return path_to(tree.parents, path[-1]) if path else [0]
