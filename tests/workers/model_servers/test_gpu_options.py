"""What an instance's GPUs mean for its model server: the memory plan's command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglenest.foundation.instance_types import lookup
from eaglenest.foundation.memory_plan import gpus_of_type
from eaglenest.workers.model_servers import gpu_options
from eaglenest.workers.model_servers.process import EMBEDDED, VLLM, ServerSpec
from eaglenest.workers.model_servers.schedule import Schedule
from tests.support.model_shapes import write_shape


def spec(folder: Path, target: str = "Llama-3.1-8B", backend: str = VLLM,
         **overrides: object) -> ServerSpec:
    return ServerSpec(model_dir=write_shape(folder, target, **overrides), served_name="m",
                      port=1, backend=backend)


def _arg(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def test_the_vllm_command_is_the_plan(tmp_path: Path) -> None:
    s = spec(tmp_path)
    planned = gpu_options.apply(s, {}, [0], {"CUDA_VISIBLE_DEVICES": "0"},
                                gpus_of_type(lookup("ml.g5.2xlarge")), cuda=True)
    assert planned is not None
    cmd = s.command()
    assert _arg(cmd, "--gpu-memory-utilization") == "0.9"
    assert _arg(cmd, "--max-model-len") == str(planned.max_model_len)
    assert _arg(cmd, "--dtype") == "bfloat16" and "--tensor-parallel-size" not in cmd
    assert 2048 <= planned.max_model_len < 131072  # the model's own, bounded by the KV cache


@pytest.mark.parametrize(("target", "type_name", "env", "tp"), [
    ("Qwen2.5-7B", "ml.p4d.24xlarge", {}, "4"),  # 28 heads: 8 does not divide
    ("Llama-3.1-8B", "ml.g5.12xlarge", {"SM_NUM_GPUS": "2"}, "2"),
    ("Llama-3.1-8B", "ml.g5.12xlarge", {"OPTION_TENSOR_PARALLEL_DEGREE": "max"}, "4"),
    ("Llama-3.1-70B", "ml.p4d.24xlarge", {}, "8"),
])
def test_tensor_parallel_divides_the_heads(tmp_path: Path, target: str, type_name: str,
                                           env: dict[str, str], tp: str) -> None:
    itype = lookup(type_name)
    s = spec(tmp_path, target)
    gpu_options.apply(s, env, list(range(itype.accelerators)), {}, gpus_of_type(itype),
                      cuda=False)
    assert _arg(s.command(), "--tensor-parallel-size") == tp


@pytest.mark.parametrize(("target", "type_name", "env", "message"), [
    ("Llama-3.1-8B", "ml.g5.12xlarge", {"SM_NUM_GPUS": "3"},
     "SM_NUM_GPUS=3 does not divide the model's attention heads: LlamaForCausalLM has 32 "
     "attention heads and 8 KV heads; degrees that work on 4 GPU(s): 1, 2, 4"),
    ("Llama-3.1-8B", "ml.g5.12xlarge", {"SM_NUM_GPUS": "8"},
     "SM_NUM_GPUS=8 asks for more GPUs than the instance holds (4)"),
    ("Llama-3.1-8B", "ml.g5.12xlarge", {"OPTION_TENSOR_PARALLEL_DEGREE": "two"},
     "OPTION_TENSOR_PARALLEL_DEGREE='two' must be a positive integer or max"),
    ("Llama-3.1-8B", "ml.g5.12xlarge", {"OPTION_GPU_MEMORY_UTILIZATION": "1.5"},
     "OPTION_GPU_MEMORY_UTILIZATION='1.5' must be a number in (0, 1]"),
    ("Llama-3.1-8B", "ml.g5.12xlarge", {"OPTION_DTYPE": "int8"},
     "OPTION_DTYPE='int8' is not a dtype EagleNest accepts; use one of fp16, float16, half, "
     "bf16, bfloat16, fp32, float32, float, auto"),
])
def test_options_that_cannot_hold_are_refused_by_name(tmp_path: Path, target: str,
                                                      type_name: str, env: dict[str, str],
                                                      message: str) -> None:
    itype = lookup(type_name)
    with pytest.raises(gpu_options.GpuOptionError) as exc:
        gpu_options.apply(spec(tmp_path, target), env, list(range(itype.accelerators)), {},
                          gpus_of_type(itype), cuda=True)
    assert str(exc.value) == message


def test_a_model_that_does_not_fit_is_refused_with_its_sizes(tmp_path: Path) -> None:
    with pytest.raises(gpu_options.GpuOptionError) as exc:
        gpu_options.apply(spec(tmp_path, "Qwen2.5-14B"), {}, [0], {},
                          gpus_of_type(lookup("ml.g5.xlarge")), cuda=True)
    assert "the model does not fit ml.g5.xlarge (1 x A10G 24 GiB)" in str(exc.value)
    assert "27.5 GiB of weights" in str(exc.value)


def test_lmi_options_reach_the_command_line(tmp_path: Path) -> None:
    s = spec(tmp_path)
    env = {"OPTION_DTYPE": "fp16", "OPTION_MAX_ROLLING_BATCH_SIZE": "32",
           "OPTION_MAX_MODEL_LEN": "4096", "OPTION_GPU_MEMORY_UTILIZATION": "0.85"}
    gpu_options.apply(s, env, [0], {}, gpus_of_type(lookup("ml.g6e.xlarge")), cuda=True)
    cmd = s.command()
    assert (_arg(cmd, "--dtype"), _arg(cmd, "--max-num-seqs"), _arg(cmd, "--max-model-len"),
            _arg(cmd, "--gpu-memory-utilization")) == ("float16", "32", "4096", "0.85")


def test_bfloat16_becomes_float16_below_ampere(tmp_path: Path) -> None:
    small = spec(tmp_path, "Llama-3.1-8B", num_hidden_layers=4)  # bf16 config, tiny shape
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 2 * 10**9}, "weight_map": {}}))
    gpu_options.apply(small, {}, [0], {}, gpus_of_type(lookup("ml.g4dn.xlarge")), cuda=True)
    assert small.dtype == "float16"


def test_a_declared_inventory_without_cuda_keeps_the_cpu_dtype(tmp_path: Path) -> None:
    s = spec(tmp_path)
    gpu_options.apply(s, {}, [2, 3], {"CUDA_VISIBLE_DEVICES": "2,3"},
                      gpus_of_type(lookup("ml.g5.12xlarge")), cuda=False)
    assert s.dtype == "float32" and s.env()["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert _arg(s.command(), "--tensor-parallel-size") == "2"  # 2 of 4 GPUs held here


def test_the_embedded_engine_gets_the_length_and_batch(tmp_path: Path) -> None:
    s = spec(tmp_path, backend=EMBEDDED)
    gpu_options.apply(s, {"OPTION_MAX_ROLLING_BATCH_SIZE": "4", "MAX_INPUT_LENGTH": "1000"},
                      [0], {}, gpus_of_type(lookup("ml.g6e.xlarge")), cuda=True)
    cmd = s.command()
    assert _arg(cmd, "--max-num-seqs") == "4"
    assert int(_arg(cmd, "--max-model-len") or 0) > 1000


def test_split_serving_on_cuda_only_when_asked_and_twice_fits(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    monkeypatch.setattr("eaglenest.workers.model_servers.process.vllm_dynamic_speculation",
                        lambda: True)
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16",
                                                  "num_hidden_layers": 1}))
    (head / "model.safetensors").write_bytes(b"\0" * 1024)

    def served(type_name: str, env: dict[str, str]) -> ServerSpec:
        s = spec(tmp_path / type_name)
        s.head_dir, s.schedule = head, Schedule(((1, 3), (4, 0)))
        gpu_options.apply(s, env, [0], {}, gpus_of_type(lookup(type_name)), cuda=True)
        return s

    assert not served("ml.g6e.xlarge", {}).split  # not asked
    both = served("ml.g6e.xlarge", {"EAGLENEST_SPLIT_SERVING": "1"})  # 2 x 15 GiB in 43 GiB
    assert both.split and both.gpu_memory_utilization == pytest.approx(0.45)
    assert not served("ml.g5.xlarge", {"EAGLENEST_SPLIT_SERVING": "1"}).split  # 24 GiB
