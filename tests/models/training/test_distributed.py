"""Data-parallel training (DDP) on the CPU: 2 processes under torchrun with gloo.

The ranks (tests/models/training/ddp_worker.py) train an EAGLE-3 head on the tiny Llama target for
4 steps with ``batch_size=1`` per rank, i.e. a global batch of 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from eaglenest.models.capture.cache import CaptureCache
from eaglenest.models.commands import main
from eaglenest.models.heads.base import HeadLoss
from eaglenest.models.heads.registry import HEADS
from eaglenest.models.target import Target
from eaglenest.models.training.distributed import Dist, shard
from eaglenest.models.training.optim import make_optimizer
from eaglenest.models.training.train import BatchStream, collate
from tests.models.training.ddp_worker import STEPS, config, make_samples

HERE = Path(__file__).parent
REPO = HERE.parents[1]



def _steps(result: dict) -> list[dict]:
    """The training history without its wall-clock stamps (each rank stamps its own)."""
    return [{k: v for k, v in row.items() if k != "ts"} for row in result["history"]]

def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def ranks(tiny_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(root folder, [rank 0 results, rank 1 results]) of one torchrun of ddp_worker.py."""
    root = tmp_path_factory.mktemp("ddp")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(HERE / "ddp_worker.py"), str(tiny_dir("LlamaForCausalLM")), str(root),
    ]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root, [torch.load(root / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def test_ranks_end_bit_identical(ranks: Any) -> None:
    """(a) Same start (DDP broadcasts rank 0), same averaged gradients -> same bits."""
    _, (r0, r1) = ranks
    for run in ("straight", "first", "resumed", "peagle whole", "peagle parts"):
        a, b = r0[run]["state"], r1[run]["state"]
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), (run, k)
        assert _steps(r0[run]) == _steps(r1[run])  # all-reduced loss / accuracy
    assert r0["straight"]["steps"] == STEPS


def test_ddp_in_sequence_partitions_equals_whole(ranks: Any) -> None:
    """(c) P-EAGLE under DDP in 3 parts a step (the first two backwards kept local) trains
    the head the whole steps train (float summation order apart)."""
    _, (r0, _) = ranks
    whole, parts = r0["peagle whole"], r0["peagle parts"]
    assert parts["steps"] == whole["steps"] == STEPS
    for k in whole["state"]:
        torch.testing.assert_close(parts["state"][k], whole["state"][k], rtol=1e-4,
                                   atol=1e-5, msg=k)
    assert [h["loss"] for h in parts["history"]] == pytest.approx(
        [h["loss"] for h in whole["history"]], rel=1e-4)


def _reference(target: Target, steps: int) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process doing by hand what 2-rank DDP does: per step, the global batch of 2
    from the same BatchStream, each rank's half (one sample) run alone, gradients averaged
    (backward of loss/2 for each half), then the same clipping, AdamW and schedule."""
    samples = make_samples(target)
    cfg = config(None)
    kind = HEADS[cfg.head]
    torch.manual_seed(cfg.seed)
    head = kind.build(target, samples, cfg).train()
    opt, sched = make_optimizer(head, cfg)
    stream = BatchStream(samples, 2 * cfg.batch_size, cfg.seed)
    cache = CaptureCache(target, samples, 1 << 30)
    params = [p for p in head.parameters() if p.requires_grad]
    pad, cpu, losses = target.tokenizer.pad_token_id, torch.device("cpu"), []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        step_loss, indices = 0.0, stream.next_indices()
        for rank in (0, 1):
            share = shard(indices, Dist(rank, 2))
            batch = collate([samples[i] for i in share], pad, cpu)
            cap = cache.capture(share, batch.input_ids.shape[1], cpu)
            head_loss = cast(Callable[..., HeadLoss], head.loss)
            loss = head_loss(batch, cap, **kind.loss_kwargs(cfg)).loss
            (loss / 2).backward()
            step_loss += float(loss.detach()) / 2
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        sched.step()
        losses.append(step_loss)
    return head.state_dict(), losses


def test_ddp_equals_one_process_averaging_the_shares(ranks: Any, llama: Target) -> None:
    """(b) DDP == one process averaging the two per-rank gradients.

    Every head's loss is a masked mean over the positions its own batch scores, and DDP
    averages the ranks' gradients, so a 2-rank step follows grad(mean(loss_r0, loss_r1)).
    That is NOT one process on the union batch (``batch_size=2``): that would weight each
    sample by its count of scored positions, and these samples score 8, 2, 17, 17 and 10.
    So the reference is the exact DDP math, done by hand in one process (``_reference``),
    with one thread like the ranks. Scaling by 1/2 is exact in floating point, so this is
    expected to agree bit for bit; the tolerance only absorbs kernel differences.
    """
    _, (r0, _) = ranks
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        state, losses = _reference(llama, STEPS)
    finally:
        torch.set_num_threads(threads)
    ddp = r0["straight"]["state"]
    for k in state:
        torch.testing.assert_close(ddp[k], state[k], rtol=1e-6, atol=1e-7, msg=k)
    logged = [h["loss"] for h in r0["straight"]["history"]]
    assert logged == pytest.approx(losses, rel=1e-6)


def test_only_rank0_writes(ranks: Any) -> None:
    """(c) rank 1 never asked save_head to write; rank 0 wrote heads and checkpoints."""
    root, (r0, r1) = ranks
    assert r1["writes"] == []
    assert str(root / "a") in r0["writes"] and str(root / "b") in r0["writes"]
    assert str(root / "b" / "checkpoints" / "step-00000002") in r0["writes"]
    for f in ("config.json", "model.safetensors", "provenance.json"):
        assert (root / "a" / f).is_file()
    state = torch.load(root / "b" / "checkpoints" / "step-00000002" / "trainer_state.pt",
                       weights_only=True)
    assert state["stream"] == {"epoch": 0, "pos": 4}  # global position: 2 steps x 2 samples
    assert len(state["rank_rng"]) == 2  # every rank's RNG, for an exact resume


def test_resume_under_ddp_is_exact(ranks: Any) -> None:
    """(d) stop after 2 steps with a checkpoint, resume to 4 == straight 4, bit for bit."""
    _, (r0, _) = ranks
    assert r0["first"]["steps"] == 2 and r0["resumed"]["steps"] == STEPS
    a, b = r0["straight"]["state"], r0["resumed"]["state"]
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert _steps(r0["straight"]) == _steps(r0["resumed"])


def test_shard_worked_example() -> None:
    order = [7, 2, 9, 0]  # one global batch: batch_size 2, 2 ranks
    assert [shard(order, Dist(r, 2)) for r in (0, 1)] == [[7, 2], [9, 0]]
    assert [shard([4, 1, 8], Dist(r, 2)) for r in (0, 1)] == [[4], [1, 8]]  # uneven
    assert shard(order, Dist()) == order
    with pytest.raises(ValueError, match="cannot feed"):
        shard([1], Dist(0, 2))


def test_cli_nproc_relaunches_under_torchrun(
    tiny_dir: Callable[[str], Path], tmp_path: Path, capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``eaglenest train --nproc 2`` runs torchrun; train() initialises the group itself."""
    for k, v in _env().items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "h"
    rc = main([
        "train", "--target", str(tiny_dir("LlamaForCausalLM")), "--data", "gsm8k_training.jsonl",
        "--head", "eagle3", "--out", str(out), "--max-steps", "2", "--batch-size", "1",
        "--draft-vocab-size", "64", "--max-samples", "8", "--max-length", "96", "--quiet",
        "--nproc", "2",
    ])
    assert rc == 0
    summaries = [line for line in capfd.readouterr().out.splitlines() if line.startswith("{")]
    assert len(summaries) == 1  # rank 0 reports for both
    assert json.loads(summaries[0])["steps"] == 2
    assert (out / "model.safetensors").is_file()
