"""workers/jobs/job_target.py and its parts in capture_stage.py and options.py: the dtype a
job's target runs in (EAGLENEST_DTYPE, the checkpoint's, the GPU's compute capability; the
CPU: float32), the capture backend decided on the target's weights in that dtype against
one GPU, the vLLM children's dtype, tensor parallelism and GPU share, the GPU memory a
dropped target gives back. Real targets by config.json alone (tests/support/model_shapes)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import eaglenest.models.target as target_module
from eaglenest.foundation.environment import Kind, classify
from eaglenest.foundation.memory_plan import GIB, shape_of
from eaglenest.foundation.store.storage import LocalStore, parse_uri
from eaglenest.workers.infra.model_fetch import InputError
from eaglenest.workers.jobs import capture_stage, job_target
from eaglenest.workers.jobs.options import OptionError, parse_options
from eaglenest.workers.jobs.placing import JobGpus
from eaglenest.workers.jobs.vllm_child import engine_base
from tests.support.model_shapes import SHAPES, write_shape
from tests.workers.jobs.test_capture_stage import _out, _pipeline


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("eaglenest.workers.model_servers.process.vllm_installed", lambda: True)


@pytest.fixture
def not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("eaglenest.workers.model_servers.process.vllm_installed", lambda: False)


def _fp32(folder: Path, name: str) -> Path:
    """`name` saved in float32: the same parameters, twice the bytes."""
    write_shape(folder, name, torch_dtype="float32")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["metadata"]["total_size"] = 2 * SHAPES[name][1]
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> LocalStore:
    s = LocalStore(tmp_path_factory.mktemp("s3"))
    for f in tiny_llama_dir.iterdir():
        s.put_file(parse_uri(f"s3://models/tiny-llama/{f.name}"), f)
    return s


@pytest.mark.parametrize(("raw", "value"), [("bf16", "bfloat16"), (" FP16 ", "float16"),
                                            ("half", "float16"), ("float", "float32"),
                                            ("auto", "auto")])
def test_eaglenest_dtype_takes_every_spelling(raw: str, value: str) -> None:
    assert parse_options({"EAGLENEST_DTYPE": raw}).dtype == value
    assert parse_options({}).dtype is None
    assert classify("EAGLENEST_DTYPE") == Kind.KNOWN


def test_a_bad_dtype_names_the_variable_and_the_spellings() -> None:
    with pytest.raises(OptionError) as exc:
        parse_options({"EAGLENEST_DTYPE": "int8"})
    assert str(exc.value).startswith("EAGLENEST_DTYPE='int8' is not a dtype EagleNest "
                                     "accepts; use one of fp16, float16, half, bf16,")


def test_the_cpu_runs_float32_whatever_is_asked(tmp_path: Path) -> None:
    folder = write_shape(tmp_path / "q", "Qwen2.5-7B")
    assert job_target.job_dtype(folder, None, "cpu", None) == ("float32", "")
    assert job_target.job_dtype(folder, "bfloat16", "cpu", 8.9) == ("float32", "")


def test_a_gpu_runs_the_checkpoints_dtype_or_float16_below_ampere(tmp_path: Path) -> None:
    bf16 = write_shape(tmp_path / "bf16", "Qwen2.5-7B")
    assert job_target.job_dtype(bf16, None, "cuda:0", 8.9) == ("bfloat16", "")  # L40S
    dtype, why = job_target.job_dtype(bf16, None, "cuda:1", 7.5)  # T4
    assert dtype == "float16" and "compute capability 8 or more; this GPU has 7.5" in why
    assert job_target.job_dtype(bf16, "float32", "cuda", 9.0) == ("float32", "")  # asked
    assert job_target.job_dtype(bf16, "float16", "cuda", 9.0) == ("float16", "")
    fp32 = _fp32(tmp_path / "fp32", "Qwen2.5-7B")
    assert job_target.job_dtype(fp32, "auto", "cuda", 9.0) == ("bfloat16", "")  # vLLM's auto
    assert job_target.job_dtype(fp32, None, "cuda", None)[0] == "bfloat16"


def test_choose_for_counts_the_weights_in_the_gpu_dtype(tmp_path: Path, installed: None) -> None:
    """A float32 7B checkpoint (30 GB of files) loads in bfloat16 (14.2 GiB): it fits 60%
    of an L40S (48 GiB, 43.2 counted); a 14B (27.5 GiB in bfloat16) does not: vLLM."""
    fp32 = _fp32(tmp_path / "7b", "Qwen2.5-7B")
    assert capture_stage.choose_for(fp32, "auto", "cuda:0", 48, "bfloat16") == "in-process"
    assert capture_stage.choose_for(fp32, "auto", "cuda:0", 48, "float32") == "vllm"
    big = write_shape(tmp_path / "14b", "Qwen2.5-14B")
    assert capture_stage.choose_for(big, "auto", "cuda:0", 48, "bfloat16") == "vllm"
    assert capture_stage.choose_for(big, "auto", "cuda:0", 80, "bfloat16") == "in-process"
    assert capture_stage.choose_for(big, "auto", "cpu", 0, "float32") == "in-process"
    assert capture_stage.choose_for(big, "hf", "cuda:0", 48, "bfloat16") == "hf"


def test_a_target_too_large_for_one_gpu_without_vllm_fails_naming_sizes(
        tmp_path: Path, not_installed: None) -> None:
    big = write_shape(tmp_path / "14b", "Qwen2.5-14B")
    with pytest.raises(InputError) as exc:
        capture_stage.choose_for(big, "auto", "cuda:0", 48, "bfloat16")
    assert str(exc.value) == ("EAGLENEST_CAPTURE_BACKEND=vllm (auto: the target's 27.5 GiB "
                              "of weights take more than 60% of one GPU's 43.2 GiB) needs "
                              "vLLM installed on the worker")
    with pytest.raises(InputError, match=r"^EAGLENEST_CAPTURE_BACKEND=hf holds the whole "
                                         r"target on one GPU, but the target's 27.5 GiB of "
                                         r"weights are more than one GPU's 21.6 GiB"):
        capture_stage.choose_for(big, "hf", "cuda:0", 24, "bfloat16")


def test_vllm_children_run_the_job_dtype_over_a_degree_that_divides_the_heads(
        tmp_path: Path) -> None:
    """Qwen2.5-7B (28 heads, 4 KV heads) on 8 A100s: tensor parallel 4, bfloat16, the
    capture engine's share less the capture child's ends on its first GPU."""
    folder = write_shape(tmp_path / "q", "Qwen2.5-7B")
    gpus = JobGpus(list(range(8)), {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, 40.0, 8.0)
    run = job_target.vllm_capture(folder, "cuda:0", "bfloat16", gpus, 1032, tmp_path, None,
                                  "job:t")
    assert (run.device, run.tensor_parallel_size, run.dtype) == ("cuda", 4, "bfloat16")
    assert run.env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    # 2 x 152064 x 3584 x 2 + 512 x 152064 x 6 + 1 GiB = 3.47 GiB of 36 GiB counted
    assert run.gpu_memory_utilization == pytest.approx(0.90 - 3.47 / 36, abs=1e-3)
    engine = engine_base(run.run(tmp_path / "cap", ["train"]))
    assert engine["dtype"] == "bfloat16" and engine["tensor_parallel_size"] == 4
    assert engine["gpu_memory_utilization"] == run.gpu_memory_utilization
    assert "gpu_memory_utilization" not in engine_base(run.engine())  # regeneration: default
    t4 = job_target.vllm_capture(folder, "cuda", "float16", JobGpus([0], {}, 16.0, 7.5), 264,
                                 tmp_path, None, "")
    assert (t4.tensor_parallel_size, t4.dtype) == (1, "float16")
    cpu = job_target.vllm_capture(folder, "cpu", "float32", JobGpus(), 264, tmp_path, None, "")
    assert (cpu.device, cpu.tensor_parallel_size, cpu.dtype) == ("cpu", 1, "float32")
    assert cpu.gpu_memory_utilization is None
    assert "gpu_memory_utilization" not in engine_base(cpu.run(tmp_path, ["train"]))


def test_capture_utilization_example(tmp_path: Path) -> None:
    shape = shape_of(write_shape(tmp_path / "l", "Llama-3.1-8B"))
    assert job_target.capture_utilization(shape, "bfloat16", 72 * GIB) == pytest.approx(
        0.854, abs=1e-3)
    assert job_target.capture_utilization(shape, "bfloat16", 0) is None


@pytest.mark.parametrize("initialised", [False, True])
def test_release_empties_the_gpu_cache_only_where_cuda_ran(
        monkeypatch: pytest.MonkeyPatch, initialised: bool) -> None:
    emptied: list[bool] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialised)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    assert target_module.release_gpu_memory() is initialised
    assert job_target.release() is initialised
    assert emptied == [True, True] if initialised else emptied == []


def test_a_job_in_a_gpu_dtype_trains_and_exports_the_head_in_it(
        store: LocalStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The pipeline given the dtype a GPU would get (bfloat16 here, on the CPU: job_dtype
    made to answer it, with a reason): the reason is logged, the torchrun ranks load the
    target in it (run.json), the published head is in it and says so; the checkpoints the
    ranks wrote stay float32."""
    monkeypatch.setattr(job_target, "job_dtype",
                        lambda *a: ("bfloat16", "bfloat16 because the test says so"))
    with caplog.at_level(logging.INFO, logger="eaglenest.optimize"):
        result = _pipeline(store, tmp_path, "bf16-job", EAGLENEST_TRAIN_PROCESSES="2",
                           EAGLENEST_MAX_STEPS="2", EAGLENEST_CHECKPOINT_EVERY="2").run()
    assert result.train["steps"] == 2 and result.train["processes"] == 2
    assert "job bf16-job: bfloat16 because the test says so" in caplog.messages
    assert json.loads((tmp_path / "ddp" / "run.json").read_text())["dtype"] == "bfloat16"
    head = _out(store, "bf16-job") / "eagle_model"
    weights = load_file(head / "model.safetensors")
    assert {t.dtype for t in weights.values() if t.is_floating_point()} == {torch.bfloat16}
    assert json.loads((head / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert json.loads((head / "provenance.json").read_text())["dtype"] == "bfloat16"
    ckpt = tmp_path / "train" / "checkpoints" / "step-00000002" / "model.safetensors"
    assert {t.dtype for t in load_file(ckpt).values() if t.is_floating_point()} == {
        torch.float32}


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_capture_autocast_follows_the_target_dtype() -> None:
    cuda = torch.device("cuda", 0)
    for dtype, want in ((torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
                        (torch.float32, torch.bfloat16), (None, torch.bfloat16)):
        cast = capture_stage.autocast(cuda, dtype)
        assert isinstance(cast, torch.autocast) and cast.fast_dtype == want
    assert not isinstance(capture_stage.autocast(torch.device("cpu"), torch.float16),
                          torch.autocast)
