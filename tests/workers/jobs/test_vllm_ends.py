"""workers/jobs/vllm_capture.py ``VllmEntries._entry`` without vLLM: the final norm, lm_head
and argmax over a sample's last-layer states, a chunk of rows at a time, equal the whole
sample at once (the CPU: float32, exact), and what comes back is on the CPU in float32."""

from __future__ import annotations

from pathlib import Path

import torch

from eaglenest.models.target import final_norm, load_target_ends
from eaglenest.workers.jobs.capture_stage import ENDS_CHUNK
from eaglenest.workers.jobs.vllm_capture import VllmEntries


def _states(target, seq: int) -> torch.Tensor:  # noqa: ANN001
    """What vLLM hands back for one sample: [seq, n_aux + 1, hidden]."""
    torch.manual_seed(0)
    return torch.randn(seq, len(target.aux_layer_ids) + 1, target.hidden_size) * 3


def test_chunked_ends_equal_the_whole_sample(tiny_llama_dir: Path) -> None:
    target = load_target_ends(tiny_llama_dir)
    states = _states(target, 37)
    whole = VllmEntries(None, target, [])._entry(states)  # 37 rows < ENDS_CHUNK: one chunk
    chunked = VllmEntries(None, target, [], rows=5)._entry(states)  # 8 chunks, the last 2
    assert ENDS_CHUNK == 512
    for got, want in ((chunked.aux, whole.aux), (chunked.last_hidden, whole.last_hidden),
                      (chunked.argmax, whole.argmax)):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert torch.equal(got, want)
    n_aux, hidden = len(target.aux_layer_ids), target.hidden_size
    assert whole.aux.shape == (37, n_aux * hidden) and whole.aux.dtype == torch.float32
    assert torch.equal(whole.aux, states[:, :n_aux].reshape(37, n_aux * hidden))
    with torch.no_grad():  # the unchunked reference, as the entry computed it before chunks
        last = final_norm(target.model)(states[:, n_aux])
        argmax = target.model.get_output_embeddings()(last).argmax(-1)
    assert torch.equal(whole.last_hidden, last) and torch.equal(whole.argmax, argmax)
    assert whole.argmax.dtype == torch.long and whole.argmax.device.type == "cpu"


def test_half_precision_ends_give_float32_cpu_tensors(tiny_llama_dir: Path) -> None:
    """Ends in bfloat16 (a GPU's dtype, here on the CPU): the states are cast to it, what
    comes back is float32 and close to the float32 ends' result."""
    exact = load_target_ends(tiny_llama_dir)
    half = load_target_ends(tiny_llama_dir, dtype="bfloat16")
    assert half.lm_head_weight().dtype == torch.bfloat16
    states = _states(exact, 20)
    got = VllmEntries(None, half, [], rows=8)._entry(states)
    want = VllmEntries(None, exact, [])._entry(states)
    assert got.last_hidden.dtype == torch.float32 and got.aux.dtype == torch.float32
    assert torch.allclose(got.last_hidden, want.last_hidden, rtol=2e-2, atol=2e-2)
    assert (got.argmax == want.argmax).float().mean() >= 0.8
