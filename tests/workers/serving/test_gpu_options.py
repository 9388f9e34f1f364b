"""What an instance's GPUs mean for its model server's command line and environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglenest.workers.serving import gpu_options
from eaglenest.workers.serving.process import EMBEDDED, VLLM, ServerSpec


def spec(tmp_path: Path, backend: str = VLLM, dtype: str = "bfloat16") -> ServerSpec:
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": dtype}))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1024)
    return ServerSpec(model_dir=tmp_path, served_name="m", port=1, backend=backend)


@pytest.mark.parametrize("env, gpus, tp", [
    ({}, 4, 4), ({}, 0, 1), ({"SM_NUM_GPUS": "2"}, 4, 2),
    ({"TENSOR_PARALLEL_DEGREE": "1", "SM_NUM_GPUS": "4"}, 4, 1),
    ({"OPTION_TENSOR_PARALLEL_DEGREE": "max", "SM_NUM_GPUS": "1"}, 8, 8),
    ({"SM_NUM_GPUS": "4"}, 0, 1),  # served on the CPU: one process
])
def test_tensor_parallel_degree(env: dict[str, str], gpus: int, tp: int) -> None:
    assert gpu_options.tensor_parallel(env, gpus) == tp


@pytest.mark.parametrize("env, message", [
    ({"SM_NUM_GPUS": "8"}, "SM_NUM_GPUS=8 asks for more GPUs than the instance holds (4)"),
    ({"OPTION_TENSOR_PARALLEL_DEGREE": "two"},
     "OPTION_TENSOR_PARALLEL_DEGREE='two' must be a positive integer or max"),
    ({"OPTION_GPU_MEMORY_UTILIZATION": "1.5"},
     "OPTION_GPU_MEMORY_UTILIZATION='1.5' must be a number in (0, 1]"),
])
def test_options_that_cannot_hold_are_refused_by_name(tmp_path: Path, env: dict[str, str],
                                                      message: str) -> None:
    with pytest.raises(gpu_options.GpuOptionError) as exc:
        gpu_options.apply(spec(tmp_path), env, [0, 1, 2, 3], {}, 24.0, cuda=True)
    assert str(exc.value) == message


def test_the_vllm_command_gets_the_parallelism_and_the_memory_share(tmp_path: Path) -> None:
    s = spec(tmp_path)
    gpu_options.apply(s, {"OPTION_GPU_MEMORY_UTILIZATION": "0.5"}, [2, 3],
                      {"CUDA_VISIBLE_DEVICES": "2,3"}, 24.0, cuda=False)
    cmd = s.command()
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.5"
    assert s.env()["CUDA_VISIBLE_DEVICES"] == "2,3" and s.gpus == [2, 3]
    assert s.dtype == "float32"  # a declared inventory on a CPU host: still exact


def test_one_gpu_gets_no_tensor_parallel_flag(tmp_path: Path) -> None:
    s = spec(tmp_path)
    gpu_options.apply(s, {}, [1], {"CUDA_VISIBLE_DEVICES": "1"}, 24.0, cuda=False)
    assert "--tensor-parallel-size" not in s.command()


def test_on_cuda_the_dtype_is_the_models_own(tmp_path: Path) -> None:
    vllm, embedded = spec(tmp_path), spec(tmp_path, EMBEDDED, dtype="float16")
    gpu_options.apply(vllm, {}, [0], {}, 24.0, cuda=True)
    gpu_options.apply(embedded, {}, [0], {}, 24.0, cuda=True)
    assert vllm.dtype == "auto" and embedded.dtype == "float16"
    chosen = spec(tmp_path)
    gpu_options.apply(chosen, {"OPTION_DTYPE": "float32"}, [0], {}, 24.0, cuda=True)
    assert chosen.dtype == "float32"  # left as deploy set it from the option


def test_split_serving_on_cuda_only_when_asked_and_both_copies_fit(tmp_path: Path) -> None:
    default, asked = spec(tmp_path), spec(tmp_path)
    gpu_options.apply(default, {}, [0], {}, 24.0, cuda=True)
    gpu_options.apply(asked, {"EAGLENEST_SPLIT_SERVING": "1"}, [0], {}, 24.0, cuda=True)
    assert not default.split and asked.split
    tiny_gpu = spec(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\0" * (7 * 2**20))
    gpu_options.apply(tiny_gpu, {"EAGLENEST_SPLIT_SERVING": "1"}, [0], {}, 0.01, cuda=True)
    assert not tiny_gpu.split  # 2 x 7 MiB is more than half of 10 MiB
