from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from eaglenest.models.target import (
    SUPPORTED_ARCHITECTURES,
    Capture,
    MissingModelFilesError,
    TargetError,
    UnsupportedArchitectureError,
    check_model_files,
    default_aux_layer_ids,
    ends_to,
    final_norm,
    load_target,
    load_target_ends,
    torch_dtype,
)
from eaglenest.models.tiny import ARCHITECTURES


def test_support_table_matches_the_seeds() -> None:
    heads = {a: s.head for a, s in SUPPORTED_ARCHITECTURES.items()}
    assert heads == {
        "LlamaForCausalLM": "eagle3",
        "Qwen2ForCausalLM": "eagle3",
        "Qwen3ForCausalLM": "eagle3",
        "Qwen3MoeForCausalLM": "eagle3",
        "GptOssForCausalLM": "eagle3",
        "Qwen3NextForCausalLM": "eagle",
    }


def test_default_aux_layers_follow_vllm() -> None:
    assert default_aux_layer_ids(30) == [2, 15, 27]
    assert default_aux_layer_ids(8) == [2, 4, 5]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_capture_all_architectures(arch: str, tiny_target) -> None:  # noqa: ANN001
    target = tiny_target(arch)
    ids = torch.randint(0, target.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    cap = target.capture(ids)
    h = target.hidden_size
    assert cap.aux.shape == (2, 12, 3 * h)
    assert cap.last_hidden.shape == (2, 12, h)
    assert cap.logits.shape == (2, 12, target.vocab_size)
    # aux id k is the residual stream entering layer k == HF's hidden_states[k]
    out = target.model(ids, output_hidden_states=True)
    hs = out.hidden_states
    expected = torch.cat([hs[k] for k in target.aux_layer_ids], dim=-1)
    torch.testing.assert_close(cap.aux, expected.float())
    torch.testing.assert_close(cap.logits, out.logits.float())
    # last_hidden is after the final norm: lm_head(last_hidden) are the logits
    torch.testing.assert_close(target.model.lm_head(cap.last_hidden), out.logits)


def test_missing_files_are_listed(tiny_dir, tmp_path: Path) -> None:  # noqa: ANN001
    folder = tmp_path / "m"
    shutil.copytree(tiny_dir("LlamaForCausalLM"), folder)
    (folder / "generation_config.json").unlink()
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(MissingModelFilesError) as err:
        check_model_files(folder)
    assert "generation_config.json" in str(err.value)
    assert "safetensors required" in str(err.value)
    assert len(err.value.missing) == 2


def test_sharded_index_checks_shards(tiny_dir, tmp_path: Path) -> None:  # noqa: ANN001
    folder = tmp_path / "m"
    shutil.copytree(tiny_dir("LlamaForCausalLM"), folder)
    (folder / "model.safetensors").unlink()
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(MissingModelFilesError, match="model-00001-of-00002"):
        check_model_files(folder)


def test_unsupported_architecture(tiny_dir, tmp_path: Path) -> None:  # noqa: ANN001
    folder = tmp_path / "m"
    shutil.copytree(tiny_dir("LlamaForCausalLM"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["MistralForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="Qwen3NextForCausalLM"):
        load_target(folder)


def test_aux_ids_must_increase(tiny_dir) -> None:  # noqa: ANN001
    with pytest.raises(TargetError, match="strictly increasing"):
        load_target(tiny_dir("LlamaForCausalLM"), aux_layer_ids=[4, 2, 5])


def test_a_target_loads_in_the_dtype_named(tiny_dir) -> None:  # noqa: ANN001
    """A GPU job's dtype by name (bfloat16 here on the CPU): the weights in it, the capture
    still float32; a cached capture's logits from the half-precision lm_head work without
    autocast."""
    folder = tiny_dir("LlamaForCausalLM")
    half = load_target(folder, dtype="bfloat16")
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16}
    ids = torch.randint(0, half.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    cap = half.capture(ids)
    assert cap.aux.dtype == cap.last_hidden.dtype == torch.float32
    cached = Capture(cap.aux, cap.last_hidden, lm_head=half.model.get_output_embeddings())
    torch.testing.assert_close(cached.full_logits(), cap.logits)  # [1, 9, vocab]
    assert load_target(folder).lm_head_weight().dtype == torch.float32  # the default
    assert torch_dtype("float16") is torch.float16 and torch_dtype(torch.bfloat16) is torch.bfloat16
    with pytest.raises(ValueError, match="'int8' is not one of float32, bfloat16, float16"):
        torch_dtype("int8")


def test_ends_move_and_stay_tied(tiny_dir) -> None:  # noqa: ANN001
    ends = load_target_ends(tiny_dir("LlamaForCausalLM"), dtype="float16")
    model = ends.model
    assert ends.embed_weight().dtype == torch.float16 and ends.embed_weight().device.type == "cpu"
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    ends_to(ends, "meta")  # a device with no memory stands in for cuda:0
    moved = [model.get_input_embeddings().weight, model.get_output_embeddings().weight,
             *final_norm(model).parameters()]
    assert {p.device.type for p in moved} == {"meta"}
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
