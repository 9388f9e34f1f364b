"""foundation/memory_plan.py: instance types x real targets (config.json only) -> the plan or
a refusal naming the sizes; tensor parallelism that divides; dtypes by compute capability.
The table in docs/gpu-memory.md is this matrix."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglenest.foundation.dtypes import DtypeError, for_gpu, normalize
from eaglenest.foundation.instance_types import lookup
from eaglenest.foundation.memory_plan import (
    GIB,
    Gpus,
    PlanError,
    Wants,
    gpus_of_type,
    head_estimate,
    plan,
    shape_of,
    tensor_parallel,
)
from tests.support.model_shapes import write_shape

TYPES = ("ml.g5.xlarge", "ml.g5.2xlarge", "ml.g5.12xlarge", "ml.g6e.xlarge",
         "ml.p4d.24xlarge", "ml.g4dn.xlarge")
#: (type, target) -> (tensor parallel, dtype) where it fits; absent: refused
FITS = {
    ("ml.g5.xlarge", "Llama-3.1-8B"): (1, "bfloat16"),
    ("ml.g5.2xlarge", "Llama-3.1-8B"): (1, "bfloat16"),
    ("ml.g5.12xlarge", "Llama-3.1-8B"): (4, "bfloat16"),
    ("ml.g6e.xlarge", "Llama-3.1-8B"): (1, "bfloat16"),
    ("ml.p4d.24xlarge", "Llama-3.1-8B"): (8, "bfloat16"),
    ("ml.g5.xlarge", "Qwen2.5-7B"): (1, "bfloat16"),
    ("ml.g5.2xlarge", "Qwen2.5-7B"): (1, "bfloat16"),
    ("ml.g5.12xlarge", "Qwen2.5-7B"): (4, "bfloat16"),
    ("ml.g6e.xlarge", "Qwen2.5-7B"): (1, "bfloat16"),
    ("ml.p4d.24xlarge", "Qwen2.5-7B"): (4, "bfloat16"),  # 28 heads: 8 does not divide
    ("ml.g5.12xlarge", "Qwen2.5-14B"): (4, "bfloat16"),
    ("ml.g6e.xlarge", "Qwen2.5-14B"): (1, "bfloat16"),
    ("ml.p4d.24xlarge", "Qwen2.5-14B"): (8, "bfloat16"),
    ("ml.p4d.24xlarge", "Llama-3.1-70B"): (8, "bfloat16"),
}
TARGETS = ("Llama-3.1-8B", "Qwen2.5-7B", "Qwen2.5-14B", "Llama-3.1-70B")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("shapes")
    return {name: shape_of(write_shape(root / name, name)) for name in TARGETS}


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("target", TARGETS)
def test_matrix(shapes: dict[str, object], type_name: str, target: str) -> None:
    shape = shapes[target]
    head = head_estimate(shape)  # type: ignore[arg-type]
    gpus = gpus_of_type(lookup(type_name))
    expected = FITS.get((type_name, target))
    if expected is None:
        with pytest.raises(PlanError) as exc:
            plan(shape, gpus, Wants(), head)  # type: ignore[arg-type]
        message = str(exc.value)
        assert type_name in message and "of weights" in message and "KV cache" in message
        assert "each GPU gives" in message
        return
    got = plan(shape, gpus, Wants(), head)  # type: ignore[arg-type]
    assert (got.tensor_parallel, got.dtype) == expected
    used = got.weights_per_gpu + got.head_per_gpu + got.overhead_per_gpu
    budget = got.gpu_memory_utilization * got.gpu_bytes  # type: ignore[operator]
    # one sequence of the planned length fits what is left of the share (vLLM's own start
    # check), and two of them unless the floor of 2048 tokens set the length
    assert used + got.max_model_len * got.kv_per_token <= budget
    assert 2048 <= got.max_model_len <= shape.max_position  # type: ignore[attr-defined]
    if got.max_model_len > 2048:
        assert used + 2 * got.max_model_len * got.kv_per_token <= budget


def test_g4dn_runs_float16_and_names_it(shapes: dict[str, object]) -> None:
    """T4 (compute capability 7.5) has no bfloat16: the refusal is sized in float16."""
    with pytest.raises(PlanError, match=r"in float16, 15\.0 GiB of weights"):
        plan(shapes["Llama-3.1-8B"], gpus_of_type(lookup("ml.g4dn.xlarge")))  # type: ignore[arg-type]


def test_the_14b_refusal_names_every_size(shapes: dict[str, object]) -> None:
    with pytest.raises(PlanError) as exc:
        plan(shapes["Qwen2.5-14B"], gpus_of_type(lookup("ml.g5.xlarge")),  # type: ignore[arg-type]
             Wants(), head_estimate(shapes["Qwen2.5-14B"]))  # type: ignore[arg-type]
    assert str(exc.value).startswith(
        "the model does not fit ml.g5.xlarge (1 x A10G 24 GiB): Qwen2ForCausalLM, 14.77B "
        "parameters needs, per GPU at tensor parallel 1 in bfloat16, 27.5 GiB of weights + ")
    assert "of KV cache for 2048 tokens" in str(exc.value)
    assert "but each GPU gives 19.4 GiB (0.9 of 21.6 GiB)" in str(exc.value)


@pytest.mark.parametrize(("target", "gpus", "wanted", "ok"), [
    ("Qwen2.5-7B", 8, None, 4), ("Qwen2.5-7B", 4, None, 4), ("Qwen2.5-7B", 3, None, 2),
    ("Llama-3.1-8B", 8, None, 8), ("Qwen2.5-14B", 4, None, 4), ("Qwen2.5-14B", 8, None, 8),
    ("Llama-3.1-8B", 4, 2, 2), ("Llama-3.1-8B", 0, 4, 1),
])
def test_tensor_parallel_divides_the_heads(shapes: dict[str, object], target: str, gpus: int,
                                           wanted: int | None, ok: int) -> None:
    assert tensor_parallel(shapes[target], gpus, wanted) == ok  # type: ignore[arg-type]


def test_a_degree_that_does_not_divide_is_refused_by_name(shapes: dict[str, object]) -> None:
    with pytest.raises(PlanError) as exc:
        tensor_parallel(shapes["Llama-3.1-8B"], 4, 3, "SM_NUM_GPUS")  # type: ignore[arg-type]
    assert str(exc.value) == (
        "SM_NUM_GPUS=3 does not divide the model's attention heads: LlamaForCausalLM has 32 "
        "attention heads and 8 KV heads; degrees that work on 4 GPU(s): 1, 2, 4")
    with pytest.raises(PlanError, match="asks for more GPUs than the instance holds"):
        tensor_parallel(shapes["Llama-3.1-8B"], 4, 8, "SM_NUM_GPUS")  # type: ignore[arg-type]


def test_explicit_length_and_share_win_where_they_fit(shapes: dict[str, object]) -> None:
    shape, gpus = shapes["Llama-3.1-8B"], gpus_of_type(lookup("ml.g6e.xlarge"))
    got = plan(shape, gpus, Wants(max_model_len=8192, gpu_memory_utilization=0.8,
                                  max_num_seqs=16))  # type: ignore[arg-type]
    assert (got.max_model_len, got.gpu_memory_utilization, got.max_num_seqs) == (8192, 0.8, 16)
    with pytest.raises(PlanError, match=r"131072 tokens \(OPTION_MAX_MODEL_LEN\)"):
        plan(shapes["Llama-3.1-8B"], gpus_of_type(lookup("ml.g5.xlarge")),  # type: ignore[arg-type]
             Wants(max_model_len=131072, len_variable="OPTION_MAX_MODEL_LEN"))
    with pytest.raises(PlanError, match="more than the model's own maximum, 32768"):
        plan(shapes["Qwen2.5-7B"], gpus, Wants(max_model_len=65536))  # type: ignore[arg-type]


def test_two_copies_halve_the_share(shapes: dict[str, object]) -> None:
    shape, gpus = shapes["Llama-3.1-8B"], gpus_of_type(lookup("ml.p4d.24xlarge"))
    one, two = plan(shape, gpus), plan(shape, gpus, Wants(copies=2))  # type: ignore[arg-type]
    assert two.gpu_memory_utilization == pytest.approx(one.gpu_memory_utilization / 2)  # type: ignore[operator]
    with pytest.raises(PlanError):  # 15 GiB of weights twice on one 24 GiB A10G
        plan(shape, gpus_of_type(lookup("ml.g5.xlarge")), Wants(copies=2))  # type: ignore[arg-type]


def test_the_cpu_plan_only_fixes_the_length(tmp_path: Path) -> None:
    shape = shape_of(write_shape(tmp_path / "m", "Qwen2.5-7B"))
    cpu = plan(shape, Gpus(0, 0))
    assert (cpu.dtype, cpu.max_model_len, cpu.gpu_memory_utilization) == ("float32", 2048, None)


@pytest.mark.parametrize(("raw", "value"), [
    ("fp16", "float16"), ("half", "float16"), ("BF16", "bfloat16"), (" bfloat16 ", "bfloat16"),
    ("fp32", "float32"), ("float", "float32"), ("auto", "auto")])
def test_dtype_spellings(raw: str, value: str) -> None:
    assert normalize(raw, "OPTION_DTYPE") == value


def test_an_unknown_dtype_names_the_variable_and_the_spellings() -> None:
    with pytest.raises(DtypeError) as exc:
        normalize("int4", "OPTION_DTYPE")
    assert str(exc.value).startswith("OPTION_DTYPE='int4' is not a dtype EagleNest accepts; "
                                     "use one of fp16, float16, half, bf16, bfloat16")


@pytest.mark.parametrize(("wanted", "checkpoint", "capability", "dtype", "changed"), [
    ("auto", "bfloat16", 8.6, "bfloat16", False), ("auto", "bfloat16", 7.5, "float16", True),
    ("bfloat16", "float16", 7.0, "float16", True), ("auto", "float32", 9.0, "bfloat16", False),
    ("auto", "float32", 7.5, "float16", True), ("float32", "bfloat16", 7.5, "float32", False),
    ("float16", "bfloat16", 9.0, "float16", False)])
def test_gpu_dtype_by_compute_capability(wanted: str, checkpoint: str, capability: float,
                                         dtype: str, changed: bool) -> None:
    got, reason = for_gpu(wanted, checkpoint, capability)
    assert got == dtype
    assert bool(reason) == changed and (not changed or "compute capability 8" in reason)


def test_gpus_of_type_are_the_least_memory_a_gpu_of_the_type_reports() -> None:
    gpus = gpus_of_type(lookup("ml.g5.12xlarge"))
    assert (gpus.count, gpus.memory_bytes, gpus.capability) == (4, int(21.6 * GIB), 8.6)
