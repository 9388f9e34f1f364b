from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eaglenest.models.checkpoint import load_head
from eaglenest.models.data import encode_examples, load_examples
from eaglenest.models.heads.registry import HEADS
from eaglenest.models.tiny import ARCHITECTURES
from eaglenest.models.training.config import TrainConfig
from eaglenest.models.training.optim import BudgetShare, Muon, lr_lambda, make_optimizer
from eaglenest.models.training.train import BatchStream, TrainData, latest_checkpoint, train


def cfg(tmp: Path | None, **kw) -> TrainConfig:  # noqa: ANN003
    base = dict(max_steps=3, draft_vocab_size=64, progress=False, lr=2e-3, warmup_steps=2)
    base.update(kw)
    return TrainConfig(out_dir=str(tmp) if tmp else None, **base)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_one_step_save_reload_all_architectures(arch: str, tiny_target, tmp_path: Path) -> None:  # noqa: ANN001
    target = tiny_target(arch)
    samples = encode_examples(load_examples("magicoder.jsonl")[:4], target.tokenizer, 96)
    head_kind = target.support.head
    result = train(cfg(tmp_path, head=head_kind, max_steps=1), TrainData(target, samples))
    assert result.steps == 1 and result.loss == result.loss  # not NaN
    head = result.head.eval()
    again = load_head(tmp_path, target.embed_weight(), target.lm_head_weight()).eval()
    x = torch.tensor([samples[0].input_ids[:12]])
    cap = target.capture(x)
    hidden = cap.last_hidden if head_kind == "eagle" else head.combine(cap.aux)
    pos, mask = torch.arange(12).unsqueeze(0), torch.ones(12, 12, dtype=torch.bool).tril()
    torch.testing.assert_close(
        head.step(x, hidden, pos, mask)[0], again.step(x, hidden, pos, mask)[0]
    )
    assert again.cfg.target_architecture == arch


@pytest.mark.parametrize(
    ("head", "optimizer"),
    [("eagle", "adamw"), ("eagle3", "adamw"), ("peagle", "adamw"), ("eagle3", "muon")],
)
def test_resume_is_exact(head: str, optimizer: str, llama, samples, tmp_path: Path) -> None:  # noqa: ANN001
    data = TrainData(llama, samples)
    kw = {"head": head, "max_steps": 6, "optimizer": optimizer}
    straight = train(cfg(tmp_path / "a", **kw), data)
    first = train(cfg(tmp_path / "b", **kw, checkpoint_every=2, stop_after=3), data)
    assert first.steps == 3 and latest_checkpoint(tmp_path / "b").name == "step-00000003"
    resumed = train(cfg(tmp_path / "b", **kw, resume=True), data)
    assert resumed.steps == 6
    a, b = straight.head.state_dict(), resumed.head.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert [h["loss"] for h in straight.history] == [h["loss"] for h in resumed.history]


def test_deterministic_with_seed(llama, samples) -> None:  # noqa: ANN001
    data = TrainData(llama, samples)
    r1 = train(cfg(None, head="peagle", seed=3), data)
    r2 = train(cfg(None, head="peagle", seed=3), data)
    r3 = train(cfg(None, head="peagle", seed=4), data)
    assert torch.equal(r1.head.fc.weight, r2.head.fc.weight)
    assert not torch.equal(r1.head.fc.weight, r3.head.fc.weight)


def test_init_from_existing_head(llama, samples, tmp_path: Path) -> None:  # noqa: ANN001
    data = TrainData(llama, samples)
    base = train(cfg(tmp_path / "base", head="eagle3", max_steps=2), data)
    tuned = train(cfg(None, head="eagle3", max_steps=1, init_head=str(tmp_path / "base")), data)
    assert torch.equal(tuned.head.d2t, base.head.d2t)
    assert not torch.equal(tuned.head.fc.weight, base.head.fc.weight)
    with pytest.raises(ValueError, match="eagle3 head, not eagle$"):
        train(cfg(None, head="eagle", init_head=str(tmp_path / "base")), data)


def test_a_peagle_head_starts_from_an_eagle3_head(llama, samples, tmp_path: Path) -> None:  # noqa: ANN001
    """P-EAGLE starts from EAGLE-3 (HeadSpec.starts_from): every EAGLE-3 tensor is copied,
    so its first parallel draft is EAGLE-3's first chain draft; training then moves it (its
    mask slots too); the other way round is refused."""
    data = TrainData(llama, samples)
    base = train(cfg(tmp_path / "base", head="eagle3", max_steps=2, num_layers=2), data).head
    start = HEADS["peagle"].start_from(base, llama, cfg(None, head="peagle"))
    assert type(start).__name__ == "PEagleHead" and start.cfg.num_layers == 2
    assert set(start.state_dict()) - set(base.state_dict()) == {"mask_hidden"}
    for name, tensor in base.state_dict().items():
        assert torch.equal(start.state_dict()[name], tensor), name
    with torch.no_grad():
        for sample in samples[:3]:
            ids = torch.tensor([sample.input_ids[:13]])  # [1, n + 1], n = 12
            aux = llama.capture(ids).aux[:, :12]  # [1, n, n_aux * hidden]
            first = start.eval().draft_parallel(ids, aux, 3)  # [3] target ids
            assert int(first[0]) == int(base.eval().draft_greedy(ids, aux, 1)[0])
    tuned = train(cfg(tmp_path / "p", head="peagle", max_steps=2,
                      init_head=str(tmp_path / "base")), data).head
    assert torch.equal(tuned.d2t, base.d2t)
    assert not torch.equal(tuned.fc.weight, base.fc.weight)
    with pytest.raises(ValueError, match="peagle head, not eagle3"):
        train(cfg(None, head="eagle3", init_head=str(tmp_path / "p")), data)


def test_each_step_row_reaches_on_step_with_time_and_tokens(llama, samples) -> None:  # noqa: ANN001
    from datetime import UTC, datetime, timedelta

    from eaglenest.models.training.config import config_record

    rows: list[dict] = []
    config = cfg(None, head="eagle3", on_step=rows.append)
    result = train(config, TrainData(llama, samples))
    assert rows == result.history and [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        ts = datetime.fromisoformat(row["ts"].replace("Z", "+00:00"))
        assert ts.tzinfo is not None and datetime.now(UTC) - ts < timedelta(minutes=5)
        assert row["tokens"] > 0 and len(row["accuracy"]) == config.ttt_steps
    assert [r["ts"] for r in rows] == sorted(r["ts"] for r in rows)
    assert "on_step" not in config_record(config)


def test_training_reduces_loss(llama, samples) -> None:  # noqa: ANN001
    result = train(
        cfg(None, head="eagle3", max_steps=15, lr=5e-3, batch_size=2), TrainData(llama, samples[:2])
    )
    first = sum(h["loss"] for h in result.history[:3]) / 3
    last = sum(h["loss"] for h in result.history[-3:]) / 3
    assert last < first


def test_schedule_and_stream() -> None:
    f = lr_lambda(TrainConfig(max_steps=10, warmup_steps=2, min_lr_ratio=0.1))
    assert [round(f(s), 3) for s in (0, 1, 2, 10)] == [0.5, 1.0, 1.0, 0.1]
    stream = BatchStream(list(range(5)), 2, seed=1)  # type: ignore[arg-type]
    seen = [tuple(stream.next()) for _ in range(3)]
    assert stream.state() == {"epoch": 1, "pos": 2}
    assert sorted(seen[0] + seen[1]) != list(range(5))  # an epoch drops the remainder


def test_the_schedule_decays_with_the_time_budget(llama, samples, tmp_path) -> None:  # noqa: ANN001
    """Where the time budget ends before max_steps, the cosine follows the clock: a half
    spent budget is half the decay whatever the step, a spent one the floor."""
    budget = BudgetShare()
    f = lr_lambda(TrainConfig(max_steps=100_000, warmup_steps=2, min_lr_ratio=0.1), budget)
    assert round(f(10), 4) == 1.0  # nothing spent: the steps' 0.008%
    budget.used = 0.5
    assert round(f(10), 3) == 0.55  # 0.1 + 0.9 * (1 + cos(pi / 2)) / 2
    budget.used = 1.7
    assert round(f(10), 3) == 0.1
    assert round(f(1), 3) == 1.0  # warmup stays by steps
    # a run stopped by its budget ends at the floor: the last step's LR is near min_lr_ratio.
    # The clock moves 0.1 s a reading (one a step, for the stop and the LR), so a loaded
    # host cannot stretch a step past the budget's share the assertions expect.
    readings = iter(range(1_000_000))
    result = train(cfg(tmp_path, max_steps=100_000, max_seconds=4.0, warmup_steps=2,
                       min_lr_ratio=0.1, lr=1e-3, clock=lambda: 0.1 * next(readings)),
                   TrainData(llama, samples))
    assert result.stop_reason == "time budget"
    lrs = [h["lr"] for h in result.history]
    assert lrs[-1] < 0.2e-3 < 0.9e-3 < lrs[2], lrs


def test_muon_takes_the_layer_matrices_adamw_the_rest(llama, samples) -> None:  # noqa: ANN001
    head = HEADS["peagle"].build(llama, samples, cfg(None, head="peagle"))
    opt, sched = make_optimizer(head, cfg(None, head="peagle", optimizer="muon", lr=1e-3))
    muon, adamw = opt.members
    assert isinstance(muon, Muon) and isinstance(adamw, torch.optim.AdamW)
    names = {id(p): n for n, p in head.named_parameters()}
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    in_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert "fc.weight" in in_muon and "layers.0.self_attn.q_proj.weight" in in_muon
    assert {"lm_head.weight", "norm.weight", "mask_hidden"} <= in_adamw
    assert not in_muon & in_adamw and "embed_tokens.weight" not in in_muon | in_adamw
    assert all(p.ndim == 2 for g in muon.param_groups for p in g["params"])
    assert sched.get_last_lr() == [pytest.approx(1e-3 / 2)]  # warm-up step 1 of 2
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        make_optimizer(head, cfg(None, optimizer="sgd"))


def test_extra_layers_train_under_muon_and_layer_counts_are_checked(llama, samples) -> None:  # noqa: ANN001
    result = train(cfg(None, head="eagle3", num_layers=2, max_steps=2), TrainData(llama, samples))
    assert len(result.head.layers) == 2 and result.steps == 2
    muon = make_optimizer(result.head, cfg(None, head="eagle3", num_layers=2))[0].members[0]
    in_muon = {id(p) for g in muon.param_groups for p in g["params"]}
    assert id(result.head.layers[1].self_attn.q_proj.weight) in in_muon
    for head, layers in (("eagle", 2), ("eagle3", 0)):
        with pytest.raises(ValueError, match=f"num_layers={layers}: EAGLE-3 and P-EAGLE heads"):
            train(cfg(None, head=head, num_layers=layers), TrainData(llama, samples))
