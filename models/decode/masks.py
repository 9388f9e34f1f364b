"""Attention masks and index helpers for tree decoding (pure tensor functions).

A draft tree of n nodes is stored as a ``parents`` list: node 0 is the root (the last
committed token, not yet seen by the target), node i > 0 has ``parents[i] < i``. Parents
always come before children, so a single left-to-right pass computes depths and
ancestor sets.
"""

from __future__ import annotations

import torch


def tree_depths(parents: list[int]) -> list[int]:
    """Depth of every node (root 0). Example parents [-1, 0, 0, 1] -> [0, 1, 1, 2]."""
    depths = [0] * len(parents)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    return depths


def tree_mask(parents: list[int]) -> torch.Tensor:
    """[n, n] bool: node i may attend node j iff j is i or one of i's ancestors.

    Row i is row parents[i] plus the diagonal. Example parents [-1, 0, 0, 1]
    (root -> a, root -> b, a -> c):
        [[1, 0, 0, 0],
         [1, 1, 0, 0],
         [1, 0, 1, 0],
         [1, 1, 0, 1]]
    """
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        mask[i] |= mask[parents[i]]
    return mask


def path_to(parents: list[int], node: int) -> list[int]:
    """Root-to-node indices. Example parents [-1, 0, 0, 1], node 3 -> [0, 1, 3]."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def children_of(parents: list[int]) -> list[list[int]]:
    """Children lists in index order. Example [-1, 0, 0, 1] -> [[1, 2], [3], [], []]."""
    kids: list[list[int]] = [[] for _ in parents]
    for i in range(1, len(parents)):
        kids[parents[i]].append(i)
    return kids


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[q, k] bool -> [1, 1, q, k] additive float mask: 0 where allowed, dtype-min elsewhere."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    neg = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, neg)[None, None]


def sliding_mask(query_pos: torch.Tensor, key_pos: torch.Tensor, window: int) -> torch.Tensor:
    """[q, k] bool: key within the query's sliding window (transformers' rule
    ``kv_pos > q_pos - window``). Example window 2, query_pos [3], key_pos [0, 1, 2, 3]
    -> [[0, 0, 1, 1]]."""
    return key_pos.view(1, -1) > (query_pos.view(-1, 1) - window)
