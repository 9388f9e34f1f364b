"""Embedded servers on one host share the linear-kernel timing cache (--kernel-cache).

A server started with ServerSpec.kernel_cache measures the candidates for its linears and
writes the settled timings to <dir>/linear-kernels.json; the next server over the same
shapes on this host reads them instead of measuring (its log says ``cached``)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from eaglenest.foundation.host.processes import free_port
from eaglenest.models.decode.kernel_cache import FILE_NAME
from eaglenest.workers.model_servers.process import ServerProcess, ServerSpec


@pytest.fixture(scope="module")
def small_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama whose layer linears and lm_head each pass the chooser's 1M-weight
    floor for timing (the tiny test model's do not: they are chosen untimed)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from eaglenest.models.tiny import build_tokenizer

    folder = tmp_path_factory.mktemp("small") / "llama"
    folder.mkdir(parents=True)
    tok = build_tokenizer(folder)
    config = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688,
                         num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def _kernel_line(spec: ServerSpec, log_path: Path) -> str:
    """Start the server, wait for /health, stop it; its `linear kernels:` log line."""
    server = ServerProcess(spec, log_path)
    server.launch()
    try:
        server.wait_healthy(time.monotonic() + 120)
    finally:
        server.stop()
    lines = [ln for ln in log_path.read_text().splitlines() if "linear kernels:" in ln]
    assert len(lines) == 1, log_path.read_text()[-2000:]
    return lines[0]


def test_second_server_reads_the_timings_the_first_settled(small_llama: Path,
                                                           tmp_path: Path) -> None:
    cache = tmp_path / "kernels"

    def spec() -> ServerSpec:
        return ServerSpec(model_dir=small_llama, served_name="m", port=free_port(),
                          kernel_cache=cache, extra_env={"EAGLENEST_TORCH_THREADS": "1"})

    assert spec().command()[-2:] == ["--kernel-cache", str(cache)]
    first = _kernel_line(spec(), tmp_path / "first.log")
    if "busy" in first:
        pytest.skip(f"the host was busy while the first server timed its kernels: {first}")
    assert re.search(r"layers=\w+ \(measured;", first), first
    stored = json.loads((cache / FILE_NAME).read_text())
    assert stored["version"] == 1 and len(stored["entries"]) == 2  # layers and lm_head
    second = _kernel_line(spec(), tmp_path / "second.log")
    assert re.search(r"layers=\w+ \(cached;", second), second
    assert re.search(r"lm_head=\w+ \(cached;", second), second


def test_without_a_cache_every_server_measures(small_llama: Path, tmp_path: Path) -> None:
    spec = ServerSpec(model_dir=small_llama, served_name="m", port=free_port(),
                      extra_env={"EAGLENEST_TORCH_THREADS": "1"})
    assert "--kernel-cache" not in spec.command()
    line = _kernel_line(spec, tmp_path / "server.log")
    assert "cached" not in line and "(measured" in line, line
    assert not list(tmp_path.rglob(FILE_NAME))
