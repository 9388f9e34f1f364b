"""The direct forward (models/decode/direct.py) against transformers' own forward.

The engine runs the direct forward on every target that has one, so test_engine_lossless.py
(engine == uncached greedy, every architecture and mode) also holds it end to end."""

from __future__ import annotations

import copy

import pytest
import torch

from eaglenest.models.decode.batch_kv import BatchKV
from eaglenest.models.decode.direct import MIN_CAPACITY, KVBuffer, direct_decoder
from eaglenest.models.decode.masks import tree_depths, tree_mask
from eaglenest.models.decode.runner import StepOutput, TargetRunner

DIRECT = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"]
PARENTS = [-1, 0, 0, 1, 1, 3]  # root -> a, root -> b, a -> c, a -> d, c -> e


@pytest.mark.parametrize("arch", ["GptOssForCausalLM", "Qwen3NextForCausalLM"])
def test_targets_with_windows_sinks_or_recurrence_keep_transformers_forward(
        arch, tiny_target) -> None:  # noqa: ANN001
    model = tiny_target(arch).model
    assert direct_decoder(model) is None
    assert TargetRunner(model).direct is None


def test_a_target_spread_over_devices_keeps_transformers_forward(llama) -> None:  # noqa: ANN001
    spread = copy.deepcopy(llama.model)
    assert direct_decoder(spread) is not None
    spread.model.layers[-1].to("meta")  # a second device (no memory, no compute)
    assert direct_decoder(spread) is None


def _same(got: StepOutput, ref: StepOutput) -> None:
    torch.testing.assert_close(got.logits, ref.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.last_hidden, ref.last_hidden, atol=1e-5, rtol=1e-5)
    assert (got.aux is None) == (ref.aux is None)
    if got.aux is not None:
        torch.testing.assert_close(got.aux, ref.aux, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", DIRECT)
def test_direct_forward_equals_transformers_through_a_decode(arch, tiny_target) -> None:  # noqa: ANN001
    """Prefill, a chain verify cut short, a tree verify with keep, then past the buffer's
    first capacity: every output (logits, final hidden, aux features) equals the reference."""
    target = tiny_target(arch)
    aux = list(target.aux_layer_ids)
    direct, ref = TargetRunner(target.model, aux), TargetRunner(target.model, aux, direct=False)
    assert direct.direct is not None and ref.direct is None
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 300, (40,), generator=gen).tolist()
    steps: list[tuple[str, list[int]]] = [("prefill", prompt), ("chain", [7, 8, 9, 10]),
                                          ("tree", [11, 21, 22, 31, 32, 41])]
    steps += [("chain", torch.randint(5, 300, (30,), generator=gen).tolist())] * 9
    for kind, tokens in steps:
        outs = []
        for runner in (direct, ref):
            if kind == "tree":
                outs.append(runner.forward(tokens, depths=torch.tensor(tree_depths(PARENTS)),
                                           tree=tree_mask(PARENTS)))
                runner.keep([0, 1, 3, 5])
            else:
                outs.append(runner.forward(tokens))
                runner.commit(tokens, 2 if kind == "chain" and len(tokens) == 4 else len(tokens))
        _same(*outs)
    assert direct.length == ref.length > MIN_CAPACITY
    assert direct.kv is not None and direct.kv.keys[0].shape[2] >= direct.length
    _same(direct.forward([12]), ref.forward([12]))
    cache = direct.dynamic_cache()  # the batch engine's hand-over
    for mine, theirs in zip(cache.layers, ref.cache.layers, strict=True):
        torch.testing.assert_close(mine.keys, theirs.keys[:, :, : ref.length])


def test_keep_moves_the_kept_rows_down_by_hand() -> None:
    kv = KVBuffer(layers=1, kv_heads=1, head_dim=1, dtype=torch.float32,
                  device=torch.device("cpu"))
    kv.keys[0][0, 0, :9, 0] = torch.arange(9.0)  # slots 0..3 committed, 4..8 new
    kv.length = 4
    kv.keep([0, 2, 3])
    assert kv.length == 7
    assert kv.keys[0][0, 0, :7, 0].tolist() == [0, 1, 2, 3, 4, 6, 7]
    one = torch.ones(1, 1, 2, 1)
    keys, _ = kv.append(0, one, one)  # fits: no growth
    assert kv.keys[0].shape[2] == MIN_CAPACITY and keys.shape[2] == 9
    kv.append(0, torch.ones(1, 1, MIN_CAPACITY, 1), torch.ones(1, 1, MIN_CAPACITY, 1))
    assert kv.keys[0].shape[2] == MIN_CAPACITY * 3 // 2  # grown by half, committed kept
    assert kv.keys[0][0, 0, :7, 0].tolist() == [0, 1, 2, 3, 4, 6, 7]
    big = torch.ones(1, 1, 4 * MIN_CAPACITY, 1)
    kv.append(0, big, big)  # half is not enough: grown to what the forward needs
    assert kv.keys[0].shape[2] == 7 + 4 * MIN_CAPACITY


def test_batch_rows_forward_direct_equals_transformers(llama) -> None:  # noqa: ANN001
    """The batch engine's padded rows (models/decode/batch_kv.py): rows of different lengths,
    then holes left by rejected drafts; every row's outputs equal transformers' forward."""
    aux = list(llama.aux_layer_ids)
    prompts = [[5, 17, 33, 80, 9], [1, 42], list(range(60, 80))]
    kvs = [BatchKV(llama.model, aux, direct=d) for d in (True, False)]
    assert kvs[0].direct is not None and kvs[1].direct is None
    for kv in kvs:
        for prompt in prompts:
            runner = TargetRunner(llama.model, aux)
            runner.forward(prompt)
            runner.commit(prompt, len(prompt))
            kv.add(runner.dynamic_cache(), runner.length)
    rounds = [([[7, 8, 9], [11], [12, 13]], [[0, 1], [0], [0]]),
              ([[21, 22], [23, 24, 25], [26]], [[0], [0, 1, 2], [0]])]
    for tokens, kept in rounds:
        depths = [list(range(len(t))) for t in tokens]
        local = [torch.ones(len(t), len(t), dtype=torch.bool).tril() for t in tokens]
        outs = [kv.forward(tokens, depths, local) for kv in kvs]
        for b, t in enumerate(tokens):
            for got, want in zip(outs[0], outs[1], strict=True):
                assert got is not None and want is not None
                torch.testing.assert_close(got[b, : len(t)], want[b, : len(t)],
                                           atol=1e-5, rtol=1e-5)
        for kv in kvs:
            for b, keep in enumerate(kept):
                kv.commit(b, keep)
