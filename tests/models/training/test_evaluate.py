"""Held-out accuracy, the plateau stop and the time budget (models/training/evaluate.py,
models/training/train.py): the held-out figure is training's step accuracy on samples it never trains
on, computed directly from live target captures here; evaluating leaves training's result
unchanged; a flat held-out accuracy stops training after EAGLENEST_PLATEAU_EVALS evaluations
and a rising one does not; a (fake) clock past the budget stops it, and the result says why."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eaglenest.models.data import encode_examples, load_examples
from eaglenest.models.heads.registry import HEADS
from eaglenest.models.training.config import TrainConfig
from eaglenest.models.training.evaluate import HELDOUT_KEY, HeldOut, collate, plateaued
from eaglenest.models.training.train import TrainData, latest_checkpoint, train


def cfg(tmp: Path | None = None, **kw) -> TrainConfig:  # noqa: ANN003
    base = dict(head="eagle3", max_steps=4, draft_vocab_size=64, progress=False, lr=2e-3,
                warmup_steps=2, batch_size=2, seed=5, optimizer="adamw")
    base.update(kw)
    return TrainConfig(out_dir=str(tmp) if tmp else None, **base)


@pytest.fixture(scope="module")
def heldout(llama) -> list:  # noqa: ANN001
    examples = load_examples("gsm8k_training.jsonl")[12:16]  # not among `samples` ([:12])
    return encode_examples(examples, llama.tokenizer, max_length=160)


def direct_accuracy(head, target, samples, config: TrainConfig) -> list[float]:  # noqa: ANN001
    """Each sample alone through the live target and the head (eval, no grad), the per-depth
    hits summed over all samples over their scored positions."""
    kwargs, hits, counts = HEADS[config.head].loss_kwargs(config), None, None
    head.eval()
    with torch.no_grad():
        for s in samples:
            batch = collate([s], 0, "cpu")
            result = head.loss(batch, target.capture(batch.input_ids), **kwargs)
            h = [a * n for a, n in zip(result.step_accuracy, result.step_counts, strict=True)]
            hits = h if hits is None else [x + y for x, y in zip(hits, h, strict=True)]
            n = result.step_counts
            counts = n if counts is None else [x + y for x, y in zip(counts, n, strict=True)]
    return [h / c for h, c in zip(hits, counts, strict=True)]


def test_heldout_accuracy_is_the_step_accuracy_on_heldout_samples(llama, samples, heldout):  # noqa: ANN001
    config = cfg(eval_every=2)
    result = train(config, TrainData(llama, samples, heldout=heldout))
    assert [h["step"] for h in result.history if HELDOUT_KEY in h] == [2, 4]
    assert result.heldout_step == 4 and len(result.heldout_accuracy) == config.ttt_steps
    assert result.heldout_accuracy == result.history[-1][HELDOUT_KEY]
    expected = direct_accuracy(result.head, llama, heldout, config)
    assert result.heldout_accuracy == pytest.approx(expected, abs=1e-6)
    assert result.stop_reason == "max steps" and result.eval_seconds > 0
    # the same figure again from a fresh HeldOut (its own captures), batched differently
    again = HeldOut(llama, heldout, 1 << 30, batch_size=3).accuracy(
        result.head, HEADS["eagle3"].loss_kwargs(config), torch.device("cpu"))
    assert again == pytest.approx(expected, abs=1e-6)


def test_evaluating_does_not_change_training(llama, samples, heldout):  # noqa: ANN001
    data = TrainData(llama, samples, heldout=heldout)
    plain = train(cfg(head="peagle", max_steps=3), data)  # P-EAGLE draws from the RNG
    evaluated = train(cfg(head="peagle", max_steps=3, eval_every=1), data)
    assert torch.equal(plain.head.fc.weight, evaluated.head.fc.weight)
    assert plain.heldout_accuracy == [] and plain.heldout_step is None
    assert len(evaluated.heldout_accuracy) == 3  # parallel_depth


def test_plateaued_counts_evaluations_without_a_margin_of_improvement():
    def hist(*acc: float) -> list[dict]:
        return [{"step": i, HELDOUT_KEY: [a]} for i, a in enumerate(acc)] + [{"step": 99}]

    assert plateaued(hist(0.30, 0.40, 0.405, 0.39), 2, 0.01)
    assert not plateaued(hist(0.30, 0.40, 0.405, 0.42), 2, 0.01)
    assert not plateaued(hist(0.30, 0.40, 0.405, 0.39), 0, 0.01)  # off
    assert not plateaued(hist(0.5, 0.5), 2, 0.01)  # too few evaluations yet


def flat(monkeypatch: pytest.MonkeyPatch, values: list[float]) -> None:
    """HeldOut.accuracy returns ``values`` in turn (the last one from then on)."""
    calls = iter(values)

    def fake(self, head, kwargs, device):  # noqa: ANN001, ANN202
        return [next(calls, values[-1])] * 3

    monkeypatch.setattr(HeldOut, "accuracy", fake)


def test_plateau_stops_on_a_flat_heldout_accuracy(llama, samples, heldout, monkeypatch):  # noqa: ANN001
    flat(monkeypatch, [0.5])
    data = TrainData(llama, samples, heldout=heldout)
    result = train(cfg(max_steps=20, eval_every=1, plateau_evals=2), data)
    assert (result.steps, result.stop_reason) == (3, "plateau")  # evals 2 and 3 flat vs 1


def test_plateau_does_not_stop_a_rising_heldout_accuracy(llama, samples, heldout, monkeypatch):  # noqa: ANN001
    flat(monkeypatch, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    data = TrainData(llama, samples, heldout=heldout)
    result = train(cfg(max_steps=6, eval_every=1, plateau_evals=2), data)
    assert (result.steps, result.stop_reason) == (6, "max steps")


def test_time_budget_stops_with_a_resumable_checkpoint(llama, samples, tmp_path):  # noqa: ANN001
    now = [0.0]

    def clock() -> float:  # 10 s pass between two looks at the clock
        now[0] += 10.0
        return now[0]

    config = cfg(tmp_path, max_steps=50, max_seconds=35, clock=clock, checkpoint_every=100)
    result = train(config, TrainData(llama, samples))
    # the budget starts at 10; before steps 1-4 the clock reads 20, 30, 40, 50: 40 s > 35
    assert (result.steps, result.stop_reason) == (3, "time budget")
    assert latest_checkpoint(tmp_path).name == "step-00000003"
    assert train(cfg(max_steps=2), TrainData(llama, samples)).stop_reason == "max steps"
