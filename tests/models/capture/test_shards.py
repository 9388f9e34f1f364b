"""Capture shards on disk (models/capture/shards.py) and training from them
(models/training/shard_source.py): same tensors, same head, resume, refusal, rank assignment, the
samples file (no shard opened for the samples), and the held-out split (the same held-out
accuracy as the live target)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eaglenest.models.capture.shards import (
    HELDOUT,
    MANIFEST,
    ShardMismatchError,
    read_manifest,
    shard_name,
    write_shards,
)
from eaglenest.models.data import encode_examples, load_examples
from eaglenest.models.data.template import Sample
from eaglenest.models.heads.registry import HEADS
from eaglenest.models.target import load_target
from eaglenest.models.training import shard_source
from eaglenest.models.training.batches import rank_shards
from eaglenest.models.training.config import TrainConfig
from eaglenest.models.training.evaluate import HELDOUT_KEY, HeldOut
from eaglenest.models.training.shard_source import (
    IncompleteCaptureError,
    ShardSource,
    ShardTarget,
    read_samples,
    shard_train_data,
)
from eaglenest.models.training.train import TrainData, train

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def captured(llama, samples, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: ANN001
    """The 12 samples in shards of 5 (5 + 5 + 2), fp32."""
    folder = tmp_path_factory.mktemp("shards")
    report = write_shards(llama, samples, folder, samples_per_shard=5)
    assert report.written == [0, 1, 2] and report.forwards == len(samples)
    return folder


def _counting(monkeypatch: pytest.MonkeyPatch, target) -> list[int]:  # noqa: ANN001
    """Count the target's forwards (one per captured sample)."""
    calls: list[int] = []
    real = target.capture

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(target, "capture", counted)
    return calls


def test_shards_hold_each_samples_live_capture(captured: Path, llama, samples) -> None:  # noqa: ANN001
    manifest = read_manifest(captured)
    assert [s["samples"] for s in manifest["shards"]] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9],
                                                          [10, 11]]
    assert all(s["complete"] for s in manifest["shards"])
    assert manifest["aux_layer_ids"] == llama.aux_layer_ids and manifest["dtype"] == "float32"
    assert read_samples(captured) == samples
    target = ShardTarget(captured)
    source = ShardSource(captured, target, samples)
    for i in (0, 7, 11):
        n = len(samples[i].input_ids)
        live = llama.capture(torch.tensor([samples[i].input_ids]))
        cap = source.capture([i], n, CPU)
        torch.testing.assert_close(cap.aux[0], live.aux[0])
        torch.testing.assert_close(cap.last_hidden[0], live.last_hidden[0])
        torch.testing.assert_close(cap.full_logits()[0], live.logits[0])
        assert torch.equal(cap.target_argmax()[0], live.logits[0].argmax(-1))
    assert torch.equal(target.embed_weight(), llama.embed_weight())
    assert torch.equal(target.lm_head_weight(), llama.lm_head_weight())
    with pytest.raises(TypeError, match="cannot run the target"):
        target.capture(torch.tensor([[1, 2]]))


def test_lru_keeps_at_most_max_loaded_shards(captured: Path, samples) -> None:  # noqa: ANN001
    source = ShardSource(captured, ShardTarget(captured), samples, max_loaded=1)
    for i in (0, 1, 5, 6, 0):  # shards 0, 0, 1, 1, 0
        source.entry(i)
    assert source.loads == 3 and list(source.loaded) == [0]


@pytest.mark.parametrize("head", ["eagle", "eagle3", "peagle"])
def test_head_trained_from_shards_equals_in_process(head: str, captured: Path, llama,  # noqa: ANN001
                                                    samples) -> None:
    """Same seed: the same loss history and the same final weights, step for step."""
    cfg = dict(head=head, max_steps=6, batch_size=3, draft_vocab_size=64, progress=False,
               lr=2e-3, warmup_steps=2)
    live = train(TrainConfig(**cfg), TrainData(llama, samples))  # type: ignore[arg-type]
    data = shard_train_data(captured)
    assert not hasattr(data.target.model, "model")  # no decoder was loaded
    shards = train(TrainConfig(**cfg), data)  # type: ignore[arg-type]
    torch.testing.assert_close([h["loss"] for h in shards.history],
                               [h["loss"] for h in live.history])
    ref = live.head.state_dict()
    for k, v in shards.head.state_dict().items():
        torch.testing.assert_close(v, ref[k], msg=k)


def test_resumed_capture_skips_complete_shards(llama, samples, tmp_path: Path,  # noqa: ANN001
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, llama)
    first = write_shards(llama, samples, tmp_path, samples_per_shard=5, max_new_shards=1)
    assert first.written == [0] and len(calls) == 5  # "killed" after shard 0
    with pytest.raises(IncompleteCaptureError, match=r"shards \[1, 2\]"):
        ShardSource(tmp_path, ShardTarget(tmp_path))
    second = write_shards(llama, samples, tmp_path, samples_per_shard=5)
    assert second.skipped == [0] and second.written == [1, 2]
    assert len(calls) == 12 and second.forwards == 7  # shard 0 was not captured again
    third = write_shards(llama, samples, tmp_path, samples_per_shard=5)
    assert third.written == [] and len(calls) == 12


def test_capture_killed_mid_shard_leaves_no_partial_shard(llama, samples, tmp_path: Path,  # noqa: ANN001
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, llama)
    real = llama.capture

    def dies_on_the_seventh(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if len(calls) == 6:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(llama, "capture", dies_on_the_seventh)
    with pytest.raises(KeyboardInterrupt):
        write_shards(llama, samples, tmp_path, samples_per_shard=5)
    manifest = read_manifest(tmp_path)
    assert [s["complete"] for s in manifest["shards"]] == [True, False, False]
    assert not (tmp_path / shard_name(1)).exists()
    assert not list(tmp_path.glob("*.tmp"))


def test_mismatched_capture_is_refused(captured: Path, llama, samples, tiny_dir) -> None:  # noqa: ANN001
    before = (captured / MANIFEST).read_text()
    other = [Sample(s.input_ids[:-1], s.loss_mask[:-1]) for s in samples]
    with pytest.raises(ShardMismatchError, match="shard 0 holds other samples"):
        write_shards(llama, other, captured, samples_per_shard=5)
    with pytest.raises(ShardMismatchError, match="num_samples"):
        write_shards(llama, samples[:10], captured, samples_per_shard=5)
    with pytest.raises(ShardMismatchError, match="samples_per_shard"):
        write_shards(llama, samples, captured, samples_per_shard=4)
    with pytest.raises(ShardMismatchError, match="dtype"):
        write_shards(llama, samples, captured, samples_per_shard=5, dtype=torch.bfloat16)
    qwen = load_target(tiny_dir("Qwen2ForCausalLM"))
    with pytest.raises(ShardMismatchError, match="target="):
        write_shards(qwen, samples, captured, samples_per_shard=5)
    layers = load_target(tiny_dir("LlamaForCausalLM"), aux_layer_ids=[1, 3, 5])
    with pytest.raises(ShardMismatchError, match="aux_layer_ids"):
        write_shards(layers, samples, captured, samples_per_shard=5)
    with pytest.raises(ShardMismatchError, match="not those captured"):
        ShardSource(captured, ShardTarget(captured), other)
    with pytest.raises(ShardMismatchError, match="aux layers"):
        ShardSource(captured, layers, samples)
    assert (captured / MANIFEST).read_text() == before  # refused: nothing rewritten


def test_bfloat16_shards_store_half_and_read_back_fp32(llama, samples, tmp_path: Path) -> None:  # noqa: ANN001
    from safetensors import safe_open

    report = write_shards(llama, samples[:4], tmp_path, samples_per_shard=4,
                          dtype=torch.bfloat16)
    assert report.bytes == json.loads((tmp_path / MANIFEST).read_text())["shards"][0]["bytes"]
    with safe_open(str(tmp_path / shard_name(0)), framework="pt") as f:
        assert f.get_tensor("2.aux").dtype == torch.bfloat16
    live = llama.capture(torch.tensor([samples[2].input_ids]))
    got = ShardSource(tmp_path, ShardTarget(tmp_path)).entry(2)
    assert got.aux.dtype == torch.float32
    torch.testing.assert_close(got.aux, live.aux[0], rtol=1e-2, atol=1e-2)


def test_ranks_get_disjoint_shards_covering_all(captured: Path, samples) -> None:  # noqa: ANN001
    assert rank_shards(5, 0, 2) == [0, 1] and rank_shards(5, 1, 2) == [2, 3, 4]
    for n, w in ((3, 3), (7, 2), (8, 3), (12, 5)):
        shares = [rank_shards(n, r, w) for r in range(w)]
        assert sorted(k for s in shares for k in s) == list(range(n))
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    with pytest.raises(ValueError):
        rank_shards(2, 0, 3)
    target = ShardTarget(captured)
    ranks = [ShardSource(captured, target, shard_ids=rank_shards(3, r, 2)) for r in range(2)]
    assert [len(r.samples) for r in ranks] == [5, 7]
    assert ranks[0].samples + ranks[1].samples == samples
    torch.testing.assert_close(ranks[1].entry(0).aux,  # rank 1's first sample is sample 5
                               ShardSource(captured, target, samples).entry(5).aux)
    assert ranks[1].loads == 1 and ranks[1].where[0] == (1, 5)


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files shard_source reads (every read goes through load_file, its
    own or models/capture/shards.py's for the samples file)."""
    opened: list[str] = []
    real = shard_source.load_file

    def load_file(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        opened.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(shard_source, "load_file", load_file)
    monkeypatch.setattr("eaglenest.models.capture.shards.load_file", load_file)
    return opened


def test_samples_are_read_without_opening_a_shard(captured: Path, samples,  # noqa: ANN001
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    target = ShardTarget(captured)
    opened = _recording(monkeypatch)
    source = ShardSource(captured, target)
    assert source.samples == samples and opened == ["samples.safetensors"]
    assert read_samples(captured, [2]) == samples[10:]
    assert source.groups == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]
    assert ShardSource(captured, target, shard_ids=[1, 2]).groups == [[0, 1, 2, 3, 4], [5, 6]]
    source.entry(6)
    assert opened[-1] == shard_name(1)


def test_an_older_format_is_refused(llama, samples, tmp_path: Path) -> None:  # noqa: ANN001
    write_shards(llama, samples[:2], tmp_path, samples_per_shard=2, max_new_shards=0)
    manifest = read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps({**manifest, "version": 1}))
    with pytest.raises(ShardMismatchError, match="version 1, expected"):
        write_shards(llama, samples[:2], tmp_path, samples_per_shard=2)


@pytest.fixture(scope="module")
def heldout(llama) -> list[Sample]:  # noqa: ANN001
    examples = load_examples("gsm8k_training.jsonl")[12:17]  # not among `samples` ([:12])
    return encode_examples(examples, llama.tokenizer, max_length=160)


@pytest.fixture(scope="module")
def with_heldout(llama, samples, heldout, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: ANN001
    """6 training samples in one shard, the 5 held-out ones in shards of 2 (2 + 2 + 1)."""
    folder = tmp_path_factory.mktemp("heldout")
    write_shards(llama, samples[:6], folder, samples_per_shard=6)
    report = write_shards(llama, heldout, folder, samples_per_shard=2, split=HELDOUT)
    assert report.written == [0, 1, 2] and report.forwards == len(heldout)
    return folder


def test_heldout_split_sits_beside_the_training_shards(with_heldout: Path, llama, samples,  # noqa: ANN001
                                                       heldout) -> None:
    names = sorted(p.name for p in with_heldout.iterdir())
    assert names == ["heldout-manifest.json", "heldout-samples.safetensors",
                     "heldout-shard-00000.safetensors", "heldout-shard-00001.safetensors",
                     "heldout-shard-00002.safetensors", MANIFEST, "samples.safetensors",
                     shard_name(0), "target"]
    assert read_manifest(with_heldout, HELDOUT)["split"] == HELDOUT
    data = shard_train_data(with_heldout, heldout=True)
    assert data.samples == samples[:6] and data.heldout == heldout
    assert shard_train_data(with_heldout).heldout == []
    again = write_shards(llama, heldout, with_heldout, samples_per_shard=2, split=HELDOUT)
    assert again.written == [] and again.skipped == [0, 1, 2]  # resumed: nothing to do
    with pytest.raises(ShardMismatchError, match=r"\(heldout split\) was made with num_samples"):
        write_shards(llama, heldout[:4], with_heldout, samples_per_shard=2, split=HELDOUT)
    with pytest.raises(ValueError, match="other samples"):
        HeldOut(data.target, heldout[:4], 0, 2, source=data.heldout_cache)


def test_heldout_needs_its_split(captured: Path) -> None:
    with pytest.raises(FileNotFoundError, match="heldout-manifest.json"):
        shard_train_data(captured, heldout=True)


@pytest.mark.parametrize("head", ["eagle", "eagle3", "peagle"])
def test_heldout_accuracy_from_shards_equals_live(head: str, with_heldout: Path, llama,  # noqa: ANN001
                                                  samples, heldout) -> None:
    """The same head, the same figures (fp32, within 1e-6); and train() logs the same
    held-out accuracy from shards as from the live target."""
    config = TrainConfig(head=head, max_steps=4, batch_size=2, draft_vocab_size=64,
                         progress=False, lr=2e-3, warmup_steps=1, eval_every=2)
    live = train(config, TrainData(llama, samples[:6], heldout=heldout))
    data = shard_train_data(with_heldout, heldout=True)
    kwargs, cpu = HEADS[head].loss_kwargs(config), torch.device("cpu")
    want = HeldOut(llama, heldout, 1 << 30, 2).accuracy(live.head, kwargs, cpu)
    got = HeldOut(data.target, data.heldout, 0, 2, source=data.heldout_cache).accuracy(
        live.head, kwargs, cpu)
    assert any(a > 0 for a in want)  # a figure worth comparing
    assert got == pytest.approx(want, abs=1e-6)
    shards = train(config, data)
    assert [r.get(HELDOUT_KEY) for r in shards.history] == [
        pytest.approx(r[HELDOUT_KEY], abs=1e-6) if HELDOUT_KEY in r else None
        for r in live.history]
    assert shards.heldout_step == 4 and shards.heldout_accuracy
