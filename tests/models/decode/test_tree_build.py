"""EAGLE-2 tree construction (expand + rerank) and the greedy walk, on hand-built inputs."""

from __future__ import annotations

import math

import torch

from eaglenest.models.decode.tree import DraftTree, build_tree, walk_greedy
from tests.models.decode.oracle import OracleDrafter


def test_walk_greedy_docstring_example() -> None:
    tree = DraftTree(tokens=[0, 1, 3, 4], parents=[-1, 0, 1, 1])  # r, a=1, c=3, d=4
    logits = torch.zeros(4, 10)
    for row, tok in enumerate([1, 4, 7, 9]):  # argmax rows [a, d, x, y]
        logits[row, tok] = 1.0
    assert walk_greedy(tree, logits) == ([1, 3], 9)


def test_build_tree_expands_frontier_and_reranks() -> None:
    """seq positions 7.. are [10, 11, 12]; the oracle ranks the true token first with a
    gap of 3 per rank, so the true path has the best cumulative score at every depth."""
    seq = [0] * 7 + [10, 11, 12, 13]
    drafter = OracleDrafter(seq, 20, gap=3.0)
    drafter.extend([1] * 6, torch.zeros(6, 1))  # 6 committed slots: slot 5 predicts seq[7]
    tree = build_tree(drafter, root=99, depth=3, topk=2, total_tokens=6)
    assert tree.tokens[0] == 99 and len(tree.tokens) == 6
    assert all(p < i for i, p in enumerate(tree.parents) if i)  # parents before children
    # best path root -> 10 -> 11 -> 12 is in the tree, with depths 1, 2, 3
    i10 = tree.tokens.index(10)
    i11 = [i for i, t in enumerate(tree.tokens) if t == 11 and tree.parents[i] == i10][0]
    i12 = [i for i, t in enumerate(tree.tokens) if t == 12 and tree.parents[i] == i11][0]
    assert tree.depths[i12] == 3 and tree.parents[i10] == 0
    # the rest are the best-scoring siblings (one rank down = -3 each), never deeper junk
    depth_of = tree.depths
    assert sorted(depth_of[1:]) == [1, 1, 2, 2, 3]


def test_rerank_size_and_scores_monotone() -> None:
    seq = [0] * 7 + [3, 4, 5, 6, 7]
    drafter = OracleDrafter(seq, 12, gap=0.7)
    drafter.extend([1] * 6, torch.zeros(6, 1))
    tree = build_tree(drafter, root=0, depth=4, topk=3, total_tokens=10)
    assert len(tree.tokens) == 10
    assert max(tree.depths) <= 4
    assert math.isclose(tree.mask.float().sum(1)[0].item(), 1.0)


def test_walk_sampling_matches_target_distribution() -> None:
    """First emitted token of a sampling walk over a hand-built tree ~ the root's p."""
    from scipy.stats import chisquare

    from eaglenest.models.decode.tree import walk_sampling

    tree = DraftTree(tokens=[0, 2, 1, 3], parents=[-1, 0, 0, 1])  # root -> {2, 1}, 2 -> 3
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25],
                      [0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]])
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    for _ in range(8000):
        path, tok = walk_sampling(tree, p, gen)
        counts[tree.tokens[path[0]] if path else tok] += 1
    assert chisquare(counts.numpy(), (p[0] * 8000).numpy()).pvalue > 1e-3
