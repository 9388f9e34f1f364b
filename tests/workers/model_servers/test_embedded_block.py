"""The embedded server with a block-drafting head (DFlash): mode "block" served as a real
process, lossless greedy alone and batched, spec counters on /metrics; a mode the head
cannot draft in falls back to the head's own default mode."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from eaglenest.foundation.host.processes import free_port
from eaglenest.models.decode.modes import DecodeMode
from eaglenest.models.heads.registry import HEADS
from eaglenest.workers.model_servers.embedded.__main__ import build_parser, serving_mode
from eaglenest.workers.model_servers.embedded.metrics import parse_spec_counters
from eaglenest.workers.model_servers.process import EMBEDDED, ServerProcess, ServerSpec
from tests.workers.conftest import train_tiny_head
from tests.workers.model_servers.test_embedded_server import LENGTHS, PROMPTS, complete


@pytest.fixture(scope="module")
def tiny_dflash_dir(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Path:
    """A DFlash head trained 3 steps on the tiny Llama, saved as jobs save it."""
    return train_tiny_head(tmp_path_factory.mktemp("head") / "dflash", tiny_llama_dir,
                           "dflash", dflash_layers=1, dflash_block_size=6)


def _start(tmp: Path, model_dir: Path, head_dir: Path | None, name: str,
           **kw: object) -> ServerProcess:
    spec = ServerSpec(model_dir=model_dir, served_name="tiny", port=free_port(),
                      backend=EMBEDDED, head_dir=head_dir, max_model_len=256, **kw)  # type: ignore[arg-type]
    proc = ServerProcess(spec, tmp / f"{name}.log")
    proc.start(health_timeout=180)
    return proc


@pytest.fixture(scope="module")
def block_servers(tmp_path_factory, tiny_llama_dir, tiny_dflash_dir) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("block-servers")
    base = _start(tmp, tiny_llama_dir, None, "base")
    block = _start(tmp, tiny_llama_dir, tiny_dflash_dir, "block", mode="block",
                   num_speculative_tokens=5, adaptive=True)
    yield {"base": base.base_url, "block": block.base_url, "log": str(tmp / "block.log")}
    base.stop()
    block.stop()


def test_block_server_is_lossless_alone_and_batched(block_servers) -> None:  # noqa: ANN001
    jobs = list(zip(PROMPTS * 2, LENGTHS, strict=True))
    want = [complete(block_servers["base"], p, max_tokens=n)["choices"][0]["text"]
            for p, n in jobs]
    url = block_servers["block"]
    assert [complete(url, p, max_tokens=n)["choices"][0]["text"] for p, n in jobs] == want

    async def together() -> list[str]:
        async with httpx.AsyncClient(timeout=180) as client:
            replies = await asyncio.gather(*[client.post(f"{url}/v1/completions", json={
                "model": "tiny", "prompt": p, "max_tokens": n, "temperature": 0})
                for p, n in jobs])
        return [r.json()["choices"][0]["text"] for r in replies]

    assert asyncio.run(together()) == want
    spec = parse_spec_counters(httpx.get(f"{url}/metrics").text)
    assert spec["drafts"] > 0 and spec["draft_tokens"] >= spec["drafts"]
    assert "drafting" not in Path(block_servers["log"]).read_text()  # served as asked


def test_a_mode_the_head_cannot_draft_in_falls_back_to_its_default(caplog) -> None:  # noqa: ANN001
    """Chain asked of a block head serves block; block asked of an EAGLE-3 head serves
    chain; each with a warning that names the reason."""
    assert "block" in build_parser().parse_args(["--model", "m", "--mode", "block"]).mode
    block_head = next(s for s in HEADS.values() if s.block)
    chain_head = next(s for s in HEADS.values() if not s.block and not s.parallel)
    with caplog.at_level("WARNING"):
        assert serving_mode(DecodeMode.CHAIN, block_head) is DecodeMode.BLOCK
        assert serving_mode(DecodeMode.BLOCK, chain_head) is chain_head.default_mode
    assert "draft a block per forward" in caplog.text
    assert "needs a block-drafting head" in caplog.text
    assert serving_mode(DecodeMode.BLOCK, block_head) is DecodeMode.BLOCK
