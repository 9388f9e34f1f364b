"""DFlash head (models/heads/dflash.py, dflash_train.py): the block forward against a
hand-computed reference, decode == training layout, the loss and its parts, checkpoints
(ours and the public DFlash layout)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from eaglenest.models.checkpoint import load_head, load_start_head, save_head
from eaglenest.models.heads.base import Partition
from eaglenest.models.heads.dflash import DFlashHead, build
from eaglenest.models.heads.dflash_train import (
    block_forward,
    block_inputs,
    block_mask,
    pick_anchors,
    slot_weights,
)
from eaglenest.models.heads.registry import HEADS, spec_of_config, vllm_speculative_method
from eaglenest.models.target import Target
from eaglenest.models.training.config import TrainConfig
from eaglenest.models.training.evaluate import collate
from eaglenest.models.training.partition import merged
from eaglenest.models.training.train import TrainData, train

KIND = "dflash"


def make_head(llama, samples, block: int = 4, layers: int = 2) -> DFlashHead:  # noqa: ANN001
    """A built head whose norms are not all ones (so q_norm / k_norm matter)."""
    torch.manual_seed(0)
    config = TrainConfig(head=KIND, draft_vocab_size=64, dflash_block_size=block,
                         dflash_layers=layers)
    head = build(llama, samples, config).eval()
    with torch.no_grad():
        for name, p in head.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return head


# ---- a hand-computed reference ---------------------------------------------------------
def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox rotation of x [heads, s, d] at positions pos [s]."""
    half = x.shape[-1] // 2
    inv = theta ** (-2 * torch.arange(half).float() / x.shape[-1])
    ang = pos.float().unsqueeze(1) * inv  # [s, half]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], -1)


def reference_block(head: DFlashHead, x: list[int], aux: torch.Tensor, a: int,
                    block: int) -> torch.Tensor:
    """Logits [block, vocab] of anchor a's block, every step written out: context states
    c = hidden_norm(fc(aux[:a])) give each layer's injected keys k_norm(k_proj(c)) (RoPE
    at 0..a-1) and values v_proj(c); the block [x_a, MASK...] at a..a+block-1 attends to
    all of them and to all its own slots (explicit softmax)."""
    cfg, eps = head.cfg, head.cfg.rms_norm_eps
    nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    c = rms(aux[:a] @ head.fc.weight.T, head.hidden_norm.weight, eps)  # [a, h]
    hs = head.embed_tokens.weight[[x[a]] + [head.mask_token_id] * (block - 1)]  # [block, h]
    pos, ctx_pos = torch.arange(a, a + block), torch.arange(a)
    layers: list[Any] = list(head.layers)
    for layer in layers:
        att = layer.self_attn

        def keys_values(src: torch.Tensor, p: torch.Tensor, att=att):  # noqa: ANN001, ANN202
            k = (src @ att.k_proj.weight.T).view(-1, nkv, d).transpose(0, 1)
            v = (src @ att.v_proj.weight.T).view(-1, nkv, d).transpose(0, 1)
            return rope(rms(k, att.k_norm.weight, eps), p, cfg.rope_theta), v

        xn = rms(hs, layer.input_layernorm.weight, eps)
        q = (xn @ att.q_proj.weight.T).view(block, nh, d).transpose(0, 1)  # [nh, block, d]
        q = rope(rms(q, att.q_norm.weight, eps), pos, cfg.rope_theta)
        kc, vc = keys_values(c, ctx_pos)
        kb, vb = keys_values(xn, pos)
        k = torch.cat([kc, kb], 1).repeat_interleave(nh // nkv, 0)  # [nh, a + block, d]
        v = torch.cat([vc, vb], 1).repeat_interleave(nh // nkv, 0)
        weights = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d), dim=-1)
        hs = hs + (weights @ v).transpose(0, 1).reshape(block, nh * d) @ att.o_proj.weight.T
        m = rms(hs, layer.post_attention_layernorm.weight, eps)
        mlp = layer.mlp
        hs = hs + (F.silu(m @ mlp.gate_proj.weight.T) * (m @ mlp.up_proj.weight.T)) \
            @ mlp.down_proj.weight.T
    return rms(hs, head.norm.weight, eps) @ head.lm_head.weight.T


def test_block_mask_is_the_docstring_example() -> None:
    one, zero = [1, 1, 0, 0], [0, 0, 1, 1]
    assert block_mask(torch.tensor([[1, 3]]), 4, 2).int().tolist() == [[
        [1, 0, 0, 0, *one], [1, 0, 0, 0, *one], [1, 1, 1, 0, *zero], [1, 1, 1, 0, *zero]]]


def test_two_anchor_forward_equals_the_hand_reference(llama, samples) -> None:  # noqa: ANN001
    head = make_head(llama, samples)
    x = torch.tensor([samples[1].input_ids[:20]])
    aux = llama.capture(x).aux
    anchors = torch.tensor([[4, 11]])
    with torch.no_grad():
        got = block_forward(head, x, aux, anchors, torch.ones_like(anchors), 4)  # [1, 2, 4, V]
        for i, a in enumerate(anchors[0].tolist()):
            want = reference_block(head, x[0].tolist(), aux[0], a, 4)
            torch.testing.assert_close(got[0, i], want, atol=1e-5, rtol=1e-5)


def test_draft_block_over_context_kv_equals_training(llama, samples) -> None:  # noqa: ANN001
    """decode == train: one anchor's block from its own context cache equals its block in
    the many-anchor training forward; rows of different context lengths batch with
    ctx_mask; ``draft`` is the greedy read of the same logits."""
    head = make_head(llama, samples, block=5)
    x = torch.tensor([samples[2].input_ids[:24]])
    aux = llama.capture(x).aux
    anchors = torch.tensor([[0, 5, 9, 17]])
    with torch.no_grad():
        full = block_forward(head, x, aux, anchors, torch.ones_like(anchors), 5)
        rows = []
        for i, a in enumerate(anchors[0].tolist()):
            ctx = head.context_kv(aux[:, :a], torch.arange(a).unsqueeze(0))
            got = head.draft_block(x[:, a : a + 1], torch.tensor([a]), ctx, 5)  # [1, 4, V]
            torch.testing.assert_close(got[0], full[0, i, 1:], atol=1e-5, rtol=1e-5)
            drafts = head.draft(x[:, : a + 1], aux[:, :a], 4)
            assert drafts.tolist() == head.to_target_ids(got[0].argmax(-1)).tolist()
            rows.append(got[0])
        # a batch of anchors 5 and 9: row 0's context is padded to 9, masked off
        ctx = head.context_kv(aux[:, :9].expand(2, -1, -1), torch.arange(9).expand(2, 9))
        seen = torch.arange(9).unsqueeze(0) < torch.tensor([[5], [9]])
        both = head.draft_block(x[0, [5, 9]].view(2, 1), torch.tensor([5, 9]), ctx, 5, seen)
        torch.testing.assert_close(both[0], rows[1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(both[1], rows[2], atol=1e-5, rtol=1e-5)


def test_anchor_inputs_and_weights_follow_their_examples() -> None:
    tokens, positions = block_inputs(torch.tensor([[5, 6, 7, 8]]), torch.tensor([[1]]),
                                     torch.tensor([[2]]), 3, 0)
    assert tokens.tolist() == [[[6, 7, 0]]] and positions.tolist() == [[[1, 2, 3]]]
    tokens, _ = block_inputs(torch.tensor([[5, 6, 7, 8]]), torch.tensor([[2]]),
                             torch.tensor([[3]]), 3, 0)
    assert tokens.tolist() == [[[7, 8, 0]]]  # past the end: the mask token
    assert slot_weights(4, 2.0).tolist() == pytest.approx([1.0, math.exp(-0.5), math.exp(-1)])
    eligible = torch.tensor([[0, 1, 1, 0, 1]], dtype=torch.bool)
    gen = torch.Generator().manual_seed(1)
    for count in (1, 2, 3):
        picked, ok = pick_anchors(eligible, count, gen)
        assert ok.all() and set(picked[0].tolist()) <= {1, 2, 4}
        assert picked[0].tolist() == sorted(set(picked[0].tolist()))
    picked, ok = pick_anchors(eligible, 9, gen)
    assert picked[0].tolist() == [0, 1, 2, 3, 4] and ok[0].tolist() == [0, 1, 1, 0, 1]


def grads(head: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in head.named_parameters() if p.grad is not None}
    head.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("variable_prefix", [False, True])
def test_parts_sum_to_the_whole_loss_and_gradients(llama, samples,  # noqa: ANN001
                                                   variable_prefix: bool) -> None:
    head = make_head(llama, samples, block=4).train()
    batch = collate(samples[:2], llama.tokenizer.pad_token_id, torch.device("cpu"))
    cap = llama.capture(batch.input_ids, batch.attention_mask)
    kw: dict[str, Any] = {"block_size": 4, "gamma": 2.0, "anchors": 40, "variable_prefix": variable_prefix}
    whole = head.loss(batch, cap, **kw, partition=Partition(0, 1, seed=5))
    whole.loss.backward()
    expected = grads(head)
    parts = [head.loss(batch, cap, **kw, partition=Partition(i, 3, seed=5)) for i in range(3)]
    for part in parts:
        part.loss.backward()
    got = grads(head)
    trainable = {n for n, p in head.named_parameters() if p.requires_grad}
    assert set(got) == set(expected) == trainable
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=1e-4)
    total = merged(parts)
    torch.testing.assert_close(total.loss, whole.loss.detach(), atol=1e-6, rtol=1e-5)
    assert len(whole.step_counts) == 3 and total.step_counts == whole.step_counts
    assert min(whole.step_counts) > 0 or variable_prefix  # a prefix >= 2 skips slot 1
    assert sum(whole.step_counts) > 0
    assert total.step_losses == pytest.approx(whole.step_losses)
    # the loss is the weighted mean of the per-slot means
    w = slot_weights(4, 2.0).tolist()
    num = sum(wj * lj * cj for wj, lj, cj in zip(w, whole.step_losses, whole.step_counts,
                                                 strict=True))
    den = sum(wj * cj for wj, cj in zip(w, whole.step_counts, strict=True))
    assert float(whole.loss.detach()) == pytest.approx(num / den, rel=1e-5)


def test_a_part_without_anchors_scores_nothing_but_reaches_every_parameter(
        llama, samples) -> None:  # noqa: ANN001
    """More parts than anchors: an empty part's loss is 0 and still backpropagates to
    every trainable parameter (DDP without find_unused_parameters needs that)."""
    head = make_head(llama, samples).train()
    batch = collate(samples[:2], llama.tokenizer.pad_token_id, torch.device("cpu"))
    cap = llama.capture(batch.input_ids, batch.attention_mask)
    empty = head.loss(batch, cap, block_size=4, anchors=2, partition=Partition(0, 3, seed=1))
    empty.loss.backward()
    assert float(empty.loss.detach()) == 0.0 and empty.step_counts == [0, 0, 0]
    assert set(grads(head)) == {n for n, p in head.named_parameters() if p.requires_grad}


def test_a_few_steps_fit_the_target_distribution(llama, samples) -> None:  # noqa: ANN001
    """The tiny random target's distributions are nearly flat (the loss can hardly move
    below their entropy), so its logits are sharpened here: the same anchors (one seed)
    fit within a few AdamW steps."""
    head = make_head(llama, samples, block=4, layers=1).train()
    batch = collate(samples[:2], llama.tokenizer.pad_token_id, torch.device("cpu"))
    cap = llama.capture(batch.input_ids, batch.attention_mask)
    cap = replace(cap, logits=cap.logits * 30)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(16):
        result = head.loss(batch, cap, block_size=4, gamma=2.0, anchors=16,
                           partition=Partition(0, 1, seed=3))
        opt.zero_grad()
        result.loss.backward()
        opt.step()
        losses.append(float(result.loss.detach()))
    assert losses[-1] < 0.5 * losses[0], losses


def test_the_trainer_runs_it_whole_and_in_parts(llama, samples) -> None:  # noqa: ANN001
    def run(parts: int) -> list[float]:
        config = TrainConfig(head=KIND, max_steps=12, draft_vocab_size=64, progress=False,
                             lr=5e-3, warmup_steps=2, dflash_block_size=4, dflash_layers=1,
                             dflash_anchors=8, seq_partitions=parts)
        result = train(config, TrainData(llama, samples[:4]))
        assert len(result.step_accuracy) == 3  # one per drafted slot
        return [row["loss"] for row in result.history]

    whole = run(1)
    assert sum(whole[-3:]) < sum(whole[:3]), whole
    assert run(2) == pytest.approx(whole, rel=1e-3)


# ---- checkpoints ---------------------------------------------------------------------
def layer_names(layers: int) -> set[str]:
    per = ["input_layernorm.weight", "post_attention_layernorm.weight",
           *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
           "self_attn.q_norm.weight", "self_attn.k_norm.weight",
           *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down"))]
    return {f"layers.{i}.{name}" for i in range(layers) for name in per}


def test_save_writes_vllm_config_and_reloads(llama, samples, tmp_path: Path) -> None:  # noqa: ANN001
    head = make_head(llama, samples, block=6, layers=2)
    out = save_head(head, tmp_path / "ck", verifier="/models/t", provenance={"x": 1})
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"target_layer_ids": [k - 1 for k in llama.aux_layer_ids],
                                       "mask_token_id": head.cfg.mask_token_id, "block_size": 6}
    assert config["block_size"] == 6 and config["num_hidden_layers"] == 2
    assert config["draft_vocab_size"] == 64 and config["target_hidden_size"] == 32
    assert config["head_dim"] == head.cfg.head_dim and config["vocab_size"] == llama.vocab_size
    assert config["rope_theta"] == head.cfg.rope_theta and not config["attention_bias"]
    assert config["eaglenest"]["head"] == KIND and "eagle_aux_hidden_state_layer_ids" not in config
    assert vllm_speculative_method(config) == {"method": "dflash"}
    state = load_file(str(out / "model.safetensors"))
    base = {"fc.weight", "hidden_norm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    assert set(state) == base | layer_names(2)
    again = load_head(out, llama.embed_weight(), llama.lm_head_weight())
    assert isinstance(again, DFlashHead) and again.cfg == head.cfg
    for name, tensor in head.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


def public_checkpoint(head: DFlashHead, folder: Path, num_target_layers: int) -> Path:
    """``head`` written as the public DFlash checkpoints are: no lm_head, no d2t / t2d."""
    cfg = head.cfg
    folder.mkdir()
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "block_size": 16,
        "dflash_config": {"mask_token_id": cfg.mask_token_id,
                          "target_layer_ids": [k - 1 for k in cfg.aux_layer_ids]},
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "head_dim": cfg.head_dim,
        "num_key_value_heads": cfg.num_key_value_heads, "num_hidden_layers": cfg.num_layers,
        "num_target_layers": num_target_layers, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": None, "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings, "hidden_act": "silu",
        "layer_types": ["full_attention"] * cfg.num_layers, "tie_word_embeddings": False,
        "attention_bias": False, "dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(config))
    skip = ("lm_head.weight", "d2t", "t2d", "embed_tokens.weight")
    save_file({k: v.contiguous() for k, v in head.state_dict().items() if k not in skip},
              str(folder / "model.safetensors"))
    return folder


def test_public_layout_loads_as_a_start_and_served_head(llama, samples, tmp_path: Path) -> None:  # noqa: ANN001
    built = make_head(llama, samples, block=4, layers=2)
    full = {**built.cfg.to_dict(), "draft_vocab_size": llama.vocab_size}
    vocab = llama.vocab_size
    head = DFlashHead(type(built.cfg).from_dict(full), torch.zeros(vocab, dtype=torch.long),
                      torch.ones(vocab, dtype=torch.bool))
    head.load_state_dict({k: v for k, v in built.state_dict().items()
                          if k not in ("lm_head.weight", "d2t", "t2d")}, strict=False)
    head.init_from_target(llama.embed_weight(), llama.lm_head_weight())
    folder = public_checkpoint(head.eval(), tmp_path / "public", llama.num_layers)
    config = json.loads((folder / "config.json").read_text())
    assert spec_of_config(config) is HEADS[KIND]
    assert vllm_speculative_method(config) == {"method": "dflash"}
    with pytest.raises(ValueError, match="no lm_head.weight"):
        load_head(folder, llama.embed_weight())
    loaded = load_start_head(folder, llama, TrainConfig(head=KIND))
    assert isinstance(loaded, DFlashHead)
    assert loaded.cfg.aux_layer_ids == list(llama.aux_layer_ids)
    assert loaded.cfg.block_size == 16 and loaded.cfg.draft_vocab_size == vocab
    assert torch.equal(loaded.lm_head.weight, llama.lm_head_weight())
    x = torch.tensor([samples[0].input_ids[:12]])
    aux = llama.capture(x).aux
    with torch.no_grad():
        assert torch.equal(loaded.eval().draft(x, aux[:, :11], 3), head.draft(x, aux[:, :11], 3))
    out = save_head(loaded, tmp_path / "again")  # whole vocabulary: no d2t / t2d for vLLM
    state = load_file(str(out / "model.safetensors"))
    assert "d2t" not in state and "t2d" not in state and "lm_head.weight" in state
    saved = json.loads((out / "config.json").read_text())
    assert saved["dflash_config"]["target_layer_ids"] == config["dflash_config"][
        "target_layer_ids"]
    assert saved["draft_vocab_size"] == vocab


def test_a_head_over_other_target_layers_needs_a_target_capturing_them(  # noqa: ANN001
        llama, samples, tmp_path: Path) -> None:
    """A public head fusing 2 target layers (outputs of layers 0 and 3 = aux [1, 4]) is
    refused on a target capturing the default [2, 4, 5], and trains on one capturing
    [1, 4]."""
    cfg = make_head(llama, samples).cfg
    cfg = type(cfg).from_dict({**cfg.to_dict(), "aux_layer_ids": [1, 4]})
    vocab = llama.vocab_size
    head = DFlashHead(type(cfg).from_dict({**cfg.to_dict(), "draft_vocab_size": vocab}),
                      torch.zeros(vocab, dtype=torch.long), torch.ones(vocab, dtype=torch.bool))
    folder = public_checkpoint(head, tmp_path / "public", llama.num_layers)
    with pytest.raises(ValueError, match=r"load the target with aux_layer_ids=\[1, 4\]"):
        load_start_head(folder, llama, TrainConfig(head=KIND))
    target = Target(llama.model, llama.tokenizer, llama.folder, llama.architecture, [1, 4])
    loaded = load_start_head(folder, target, TrainConfig(head=KIND))
    assert isinstance(loaded, DFlashHead)
    batch = collate(samples[:2], llama.tokenizer.pad_token_id, torch.device("cpu"))
    cap = target.capture(batch.input_ids, batch.attention_mask)
    result = loaded.loss(batch, cap, block_size=4, anchors=4)
    assert result.loss.requires_grad and len(result.step_counts) == 3
