from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from eaglenest.models.checkpoint import export_head, load_head, read_head_config, save_head
from eaglenest.models.training.config import TrainConfig
from eaglenest.models.training.train import TrainData, latest_checkpoint, train
from tests.models.vllm_reference import ReferenceDraft

EXPLICIT = (
    "norm_before_residual",
    "num_aux_hidden_states",
    "eagle_aux_hidden_state_layer_ids",
    "draft_vocab_size",
    "mask_token_id",
)


def trained(llama, samples, tmp: Path, head: str, **kw):  # noqa: ANN001, ANN201
    config = TrainConfig(head=head, max_steps=4, draft_vocab_size=64, lr=3e-3, progress=False, **kw)
    return train(config, TrainData(llama, samples, "gsm8k_training.jsonl")).head.eval()


NORMS = {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True}
PLAIN = dict.fromkeys(NORMS, False)


@pytest.mark.parametrize(
    ("head", "fmt", "recipe"),
    [
        ("eagle", "native", {}),
        ("eagle3", "native", PLAIN),
        ("eagle3", "native", {**PLAIN, "norm_before_residual": True}),
        ("eagle3", "native", NORMS),
        ("eagle3", "speculators", PLAIN),
        ("eagle3", "speculators", NORMS),
        ("peagle", "native", PLAIN),
        ("peagle", "native", NORMS),
        ("peagle", "speculators", NORMS),
        ("eagle3", "native", {**NORMS, "num_layers": 2}),
        ("peagle", "speculators", {**NORMS, "num_layers": 3}),
    ],
)
def test_saved_head_drafts_match_vllm_reference(
    llama,  # noqa: ANN001
    samples,  # noqa: ANN001
    tmp_path: Path,
    head: str,
    fmt: str,
    recipe: dict[str, bool | int],
) -> None:
    model = trained(llama, samples, tmp_path, head, **recipe)
    out = save_head(model, tmp_path / "ckpt", verifier="/models/t", fmt=fmt, provenance={"x": 1})
    config = json.loads((out / "config.json").read_text())
    for key in EXPLICIT:
        assert key in config, key
    layers = int(recipe.get("num_layers", 1))
    assert config.get("transformer_layer_config", config)["num_hidden_layers"] == layers
    weights = load_file(str(out / "model.safetensors"))
    assert {k.split(".")[1] for k in weights if k.startswith("layers.")} == {
        str(i) for i in range(layers)}
    for key, value in recipe.items():
        if key in NORMS:
            assert config[key] is value, key
    assert ("input_norm.weight" in weights) is bool(
        recipe.get("norm_before_fc")
    )
    ref = ReferenceDraft(out, llama.embed_weight(), llama.lm_head_weight())
    for sample in samples[:3]:
        x = torch.tensor([sample.input_ids[:14]])
        cap = llama.capture(x)
        feats = cap.last_hidden if head == "eagle" else cap.aux
        n = 13
        mine = model.draft_greedy(x, feats[:, :n], 4).tolist()
        assert mine == ref.chain(x[0], feats[0, :n], 4)
        if head == "peagle":
            par = model.draft_parallel(x, cap.aux[:, :n], 4).tolist()
            assert par == ref.parallel(x[0], cap.aux[0, :n], 4)
    # reload: same logits
    again = load_head(out, llama.embed_weight(), llama.lm_head_weight()).eval()
    x = torch.tensor([samples[0].input_ids[:10]])
    feats = llama.capture(x)
    hid = feats.last_hidden if head == "eagle" else model.combine(feats.aux)
    pos = torch.arange(10).unsqueeze(0)
    mask = torch.ones(10, 10, dtype=torch.bool).tril()
    torch.testing.assert_close(model.step(x, hid, pos, mask)[0], again.step(x, hid, pos, mask)[0])


def test_native_eagle3_config(llama, samples, tmp_path: Path) -> None:  # noqa: ANN001
    out = save_head(trained(llama, samples, tmp_path, "eagle3"), tmp_path / "c")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert cfg["num_hidden_layers"] == 1 and cfg["draft_vocab_size"] == 64
    assert cfg["vocab_size"] == llama.vocab_size and cfg["norm_before_residual"] is True
    assert cfg["norm_before_fc"] is True and cfg["norm_output"] is True  # the default recipe
    w = load_file(str(out / "model.safetensors"))
    assert w["d2t"].dtype == torch.int64 and w["t2d"].dtype == torch.bool
    assert "embed_tokens.weight" not in w  # vLLM shares the target's embeddings


def test_peagle_speculators_config(llama, samples, tmp_path: Path) -> None:  # noqa: ANN001
    out = save_head(
        trained(llama, samples, tmp_path, "peagle"), tmp_path / "c", "/t", "speculators", 5
    )
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "peagle"
    assert cfg["mask_token_id"] == llama.tokenizer.pad_token_id
    spec = cfg["speculators_config"]
    assert spec["proposal_methods"][0]["speculative_tokens"] == 5
    assert spec["verifier"] == {"name_or_path": "/t", "architectures": ["LlamaForCausalLM"]}
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 1
    kind, hc = read_head_config(out)
    assert kind == "peagle" and hc.mask_token_id == llama.tokenizer.pad_token_id


def test_native_eagle_config_and_no_shared_weights(llama, samples, tmp_path: Path) -> None:  # noqa: ANN001
    out = save_head(trained(llama, samples, tmp_path, "eagle"), tmp_path / "c")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    from safetensors.torch import load_file

    assert set(load_file(str(out / "model.safetensors"))) == {
        "fc.weight",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.self_attn.k_proj.weight",
        "layers.0.self_attn.v_proj.weight",
        "layers.0.self_attn.o_proj.weight",
        "layers.0.post_attention_layernorm.weight",
        "layers.0.mlp.gate_proj.weight",
        "layers.0.mlp.up_proj.weight",
        "layers.0.mlp.down_proj.weight",
    }
    with pytest.raises(ValueError, match="native"):
        save_head(trained(llama, samples, tmp_path, "eagle"), tmp_path / "d", fmt="speculators")


def test_provenance(llama, samples, tmp_path: Path) -> None:  # noqa: ANN001
    config = TrainConfig(
        head="eagle3",
        max_steps=2,
        draft_vocab_size=64,
        progress=False,
        out_dir=str(tmp_path / "o"),
        seed=7,
    )
    train(config, TrainData(llama, samples, "gsm8k_training.jsonl"))
    prov = json.loads((tmp_path / "o" / "provenance.json").read_text())
    assert prov["data"] == "gsm8k_training.jsonl" and prov["steps"] == 2 and prov["seed"] == 7
    assert "git_sha" in prov and "accuracy" in prov["metrics"]


def test_export_casts_the_head_only_and_resume_reads_float32(llama, samples,  # noqa: ANN001
                                                              tmp_path: Path) -> None:
    """The exported head in bfloat16 (a P-EAGLE speculators head: mask_hidden, d2t, t2d):
    its floating tensors cast, the index maps kept, config.json and provenance.json say
    so, it loads back; the checkpoints stay float32 and training resumes from them."""
    out = tmp_path / "o"
    config = TrainConfig(head="peagle", max_steps=2, draft_vocab_size=64, progress=False,
                         out_dir=str(out), checkpoint_every=2, checkpoint_format="speculators")
    train(config, TrainData(llama, samples, "gsm8k_training.jsonl"))
    before = load_file(str(out / "model.safetensors"))
    export_head(out, "bfloat16")
    after = load_file(str(out / "model.safetensors"))
    assert sorted(after) == sorted(before)
    for key, tensor in after.items():
        if before[key].is_floating_point():
            assert tensor.dtype == torch.bfloat16, key
            assert torch.equal(tensor, before[key].to(torch.bfloat16)), key
        else:
            assert tensor.dtype == before[key].dtype and torch.equal(tensor, before[key]), key
    assert after["d2t"].dtype == torch.int64 and after["t2d"].dtype == torch.bool
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["torch_dtype"] == "bfloat16"
    assert cfg["transformer_layer_config"]["torch_dtype"] == "bfloat16"
    assert json.loads((out / "provenance.json").read_text())["dtype"] == "bfloat16"
    head = load_head(out, llama.embed_weight(), llama.lm_head_weight())
    assert torch.equal(head.state_dict()["fc.weight"], after["fc.weight"].float())
    ckpt = latest_checkpoint(out)
    assert ckpt is not None
    assert {t.dtype for t in load_file(str(ckpt / "model.safetensors")).values()
            if t.is_floating_point()} == {torch.float32}
    config.max_steps, config.resume = 3, True
    assert train(config, TrainData(llama, samples, "gsm8k_training.jsonl")).steps == 3


def test_dflash_run_saves_provenance_and_resumes_exactly(llama, samples,  # noqa: ANN001
                                                         tmp_path: Path) -> None:
    """A DFlash run (Muon, partitions drawn from the step's RNG) writes vLLM's DFlash
    config.json and provenance, and resumes from its checkpoint bit for bit."""
    data = TrainData(llama, samples[:6], "gsm8k_training.jsonl")
    kw: dict[str, Any] = {"head": "dflash", "max_steps": 4, "draft_vocab_size": 64, "progress": False,
          "dflash_block_size": 4, "dflash_layers": 2, "dflash_anchors": 8, "seed": 3}
    straight = train(TrainConfig(out_dir=str(tmp_path / "a"), **kw), data)
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 4
    assert cfg["dflash_config"]["target_layer_ids"] == [1, 3, 4]  # aux layers [2, 4, 5]
    prov = json.loads((tmp_path / "a" / "provenance.json").read_text())
    assert prov["head"] == "dflash" and prov["train_config"]["dflash_anchors"] == 8
    assert len(prov["metrics"]["accuracy"]) == 3  # one per drafted slot
    b = str(tmp_path / "b")
    first = train(TrainConfig(out_dir=b, checkpoint_every=2, stop_after=2, **kw), data)
    assert first.steps == 2
    resumed = train(TrainConfig(out_dir=b, resume=True, **kw), data)
    assert resumed.steps == 4
    x, y = straight.head.state_dict(), resumed.head.state_dict()
    for k in x:
        assert torch.equal(x[k], y[k]), k
    assert [h["loss"] for h in straight.history] == [h["loss"] for h in resumed.history]
