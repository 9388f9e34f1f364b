"""Tree masks on hand-built trees, and the target's tree forward + KV gathering."""

from __future__ import annotations

import pytest
import torch

from eaglenest.models.decode.masks import (
    additive_mask,
    children_of,
    path_to,
    sliding_mask,
    tree_depths,
    tree_mask,
)
from eaglenest.models.decode.runner import TargetRunner

# root -> a, root -> b, a -> c, a -> d, c -> e
PARENTS = [-1, 0, 0, 1, 1, 3]


def test_tree_helpers_by_hand() -> None:
    assert tree_depths(PARENTS) == [0, 1, 1, 2, 2, 3]
    assert path_to(PARENTS, 5) == [0, 1, 3, 5]
    assert children_of(PARENTS) == [[1, 2], [3, 4], [], [5], [], []]
    expect = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 0, 1, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(tree_mask(PARENTS), expect)


def test_additive_and_sliding_masks() -> None:
    m = additive_mask(torch.tensor([[True, False]]), torch.float32)
    assert m.shape == (1, 1, 1, 2) and m[0, 0, 0, 0] == 0 and m[0, 0, 0, 1] == torch.finfo(torch.float32).min
    got = sliding_mask(torch.tensor([3]), torch.arange(4), 2)
    assert got.tolist() == [[False, False, True, True]]


def _full_logits(model, ids: list[int]) -> torch.Tensor:  # noqa: ANN001
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "GptOssForCausalLM"])
def test_tree_forward_matches_each_path(arch, tiny_target) -> None:  # noqa: ANN001
    """Each node's logits in one tree forward == a plain forward of its root-to-node path.
    GPT-OSS has sliding-window layers (window 16): the 30-token prefix exercises the window."""
    target = tiny_target(arch)
    prefix = list(range(40, 70))
    tokens = [11, 21, 22, 31, 32, 41]  # one token per node of PARENTS
    runner = TargetRunner(target.model)
    runner.forward(prefix)
    runner.commit(prefix, len(prefix))
    out = runner.forward(tokens, depths=torch.tensor(tree_depths(PARENTS)), tree=tree_mask(PARENTS))
    for node in range(len(PARENTS)):
        path = [tokens[i] for i in path_to(PARENTS, node)]
        ref = _full_logits(target.model, prefix + path)
        torch.testing.assert_close(out.logits[node], ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "GptOssForCausalLM"])
def test_keep_gathers_accepted_path(arch, tiny_target) -> None:  # noqa: ANN001
    """After keeping root, a, c, e (rows [0, 1, 3, 5]) the cache equals a plain prefill."""
    target = tiny_target(arch)
    prefix = list(range(40, 58))
    tokens = [11, 21, 22, 31, 32, 41]
    runner = TargetRunner(target.model)
    runner.forward(prefix)
    runner.commit(prefix, len(prefix))
    runner.forward(tokens, depths=torch.tensor(tree_depths(PARENTS)), tree=tree_mask(PARENTS))
    runner.keep([0, 1, 3, 5])
    assert runner.length == len(prefix) + 4
    nxt = runner.forward([77]).logits[0]
    ref = _full_logits(target.model, prefix + [11, 21, 31, 41, 77])
    torch.testing.assert_close(nxt, ref, atol=1e-4, rtol=1e-4)


def test_commit_crops_rejected_chain(llama) -> None:  # noqa: ANN001
    runner = TargetRunner(llama.model)
    runner.forward([5, 6, 7])
    runner.commit([5, 6, 7], 3)
    runner.forward([8, 9, 10, 11])
    runner.commit([8, 9, 10, 11], 2)  # keep 8, 9
    assert runner.length == 5 and runner.dynamic_cache().get_seq_length() == 5
    torch.testing.assert_close(runner.forward([12]).logits[0], _full_logits(llama.model, [5, 6, 7, 8, 9, 12]),
                               atol=1e-4, rtol=1e-4)
