"""Train a head from capture shards (models/capture/shards.py) without the target's decoder.

    data = shard_train_data(folder, device)  # TrainData: stand-in target, samples, shards
    train(config, data, device)              # the same run as with the live target
    shard_train_data(folder, heldout=True)   # also the held-out split, for the held-out
                                             # accuracy (models/training/evaluate.py ``HeldOut``)

``ShardTarget`` is a ``Target`` holding only what heads and losses use of the target: its
config, tokenizer, input embeddings and lm_head (read from the capture's target/ folder; the
final norm is not needed, ``last_hidden`` is stored after it). Its decoder does not exist:
``capture()`` raises. ``ShardSource`` is a ``CaptureSource``: ``capture(indices, width,
device)`` pads per-sample entries read from the shards, keeping at most ``max_loaded``
shards in memory (least recently used first out), and leaves the logits to be recomputed
from ``last_hidden`` with the lm_head, as the in-process ``CaptureCache`` does.

Files opened: the samples come from the split's samples.safetensors, and a shard file is
opened only when one of its samples is asked for. ``ShardSource.groups`` lists the samples
of each shard file, which is how data-parallel training (models/training/batches.py ``RankStream``)
keeps each rank to its own shard files.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from eaglenest.models.capture.cache import CaptureEntry, padded_capture
from eaglenest.models.capture.shards import (
    ENDS,
    HELDOUT,
    TARGET_DIR,
    TRAIN,
    IncompleteCaptureError,
    ShardMismatchError,
    planned_samples,
    read_manifest,
    sample_hash,
)
from eaglenest.models.data.template import Sample
from eaglenest.models.target import Capture, Target
from eaglenest.models.training.train import TrainData


class _Ends(nn.Module):
    """The two ends of a causal LM (embeddings, lm_head) with transformers' accessors."""

    def __init__(self, config: Any, ends: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.config = config
        embed = ends["embed"]  # [vocab, hidden]
        self.embed_tokens = nn.Embedding(embed.shape[0], embed.shape[1], _weight=embed)
        bias = "lm_head_bias" in ends
        self.lm_head = nn.Linear(embed.shape[1], embed.shape[0], bias=bias,
                                 device="meta", dtype=embed.dtype)
        if "lm_head" in ends:
            self.lm_head.weight = nn.Parameter(ends["lm_head"])
        else:  # tied, as transformers ties them: one Parameter
            self.lm_head.weight = self.embed_tokens.weight
        if bias:
            self.lm_head.bias = nn.Parameter(ends["lm_head_bias"])

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head


class ShardTarget(Target):
    """A target without decoder layers, from a capture folder's target/ (see module doc)."""

    def __init__(self, folder: str | Path, device: str | torch.device = "cpu") -> None:
        from transformers import AutoConfig, AutoTokenizer

        manifest = read_manifest(folder)
        files = Path(folder) / TARGET_DIR
        config = AutoConfig.from_pretrained(files, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(files, trust_remote_code=False)
        model = _Ends(config, load_file(files / ENDS)).to(device)
        ident = manifest["target"]
        origin = Path(ident["path"]) if ident.get("path") else None  # provenance's verifier
        super().__init__(model, tokenizer, origin, ident["architecture"],
                         list(manifest["aux_layer_ids"]))

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def decoder_layers(self) -> nn.ModuleList:
        raise TypeError("a ShardTarget has no decoder layers: it trains from capture shards")

    def capture(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> Capture:
        raise TypeError("a ShardTarget cannot run the target: read captures from the shards")


def read_samples(folder: str | Path, shard_ids: list[int] | None = None,
                 split: str = TRAIN) -> list[Sample]:
    """The samples of a complete capture's ``split`` (all, or those of ``shard_ids``), in
    index order. Reads the split's samples file only, never a shard file."""
    shards = _complete_manifest(folder, split)["shards"]
    every = planned_samples(folder, split)
    return [every[i] for k in (shard_ids if shard_ids is not None else range(len(shards)))
            for i in shards[k]["samples"]]


def _complete_manifest(folder: str | Path, split: str = TRAIN) -> dict[str, Any]:
    manifest = read_manifest(folder, split)
    todo = [k for k, s in enumerate(manifest["shards"]) if not s["complete"]]
    if todo:
        raise IncompleteCaptureError(
            f"capture at {folder} is incomplete: {split} shards {todo} of "
            f"{len(manifest['shards'])} are not written (run the capture again to finish it)")
    return manifest


class ShardSource:
    """Captures read from the shards of ``split``; ``samples`` must be the split's samples,
    in order (``read_samples``), or the subset of ``shard_ids`` (then indices count within
    it)."""

    def __init__(
        self,
        folder: str | Path,
        target: Target,
        samples: list[Sample] | None = None,
        max_loaded: int = 2,
        shard_ids: list[int] | None = None,
        split: str = TRAIN,
    ) -> None:
        self.folder = Path(folder)
        self.manifest = _complete_manifest(folder, split)
        if list(target.aux_layer_ids) != self.manifest["aux_layer_ids"]:
            raise ShardMismatchError(f"capture at {folder} has aux layers "
                                     f"{self.manifest['aux_layer_ids']}, the target "
                                     f"{target.aux_layer_ids}")
        self.lm_head = target.model.get_output_embeddings()
        shards = self.manifest["shards"]
        ids = shard_ids if shard_ids is not None else list(range(len(shards)))
        #: sample index in ``samples`` -> (shard number, the sample's id in that shard).
        #: Example: shards [[0, 1], [2, 3], [4]], shard_ids [1, 2] -> {0: (1, 2), 1: (1, 3),
        #: 2: (2, 4)}.
        self.where = [(k, i) for k in ids for i in shards[k]["samples"]]
        self.samples = samples if samples is not None else read_samples(folder, ids, split)
        self._check_samples()
        self.max_loaded = max(1, max_loaded)
        self.loaded: OrderedDict[int, dict[str, torch.Tensor]] = OrderedDict()
        self.loads = 0  # shard files read (tests and logs)

    @property
    def groups(self) -> list[list[int]]:
        """Per shard file of this source, the indices (in ``samples``) of its samples.

        Example: shards [[0, 1], [2, 3], [4]], shard_ids [1, 2] -> [[0, 1], [2]].
        """
        out: dict[int, list[int]] = {}
        for index, (k, _) in enumerate(self.where):
            out.setdefault(k, []).append(index)
        return list(out.values())

    def _check_samples(self) -> None:
        hashes = {i: h for s in self.manifest["shards"]
                  for i, h in zip(s["samples"], s["sample_sha256"], strict=True)}
        if len(self.samples) != len(self.where) or any(
            sample_hash(s) != hashes[i] for s, (_, i) in zip(self.samples, self.where, strict=True)
        ):
            raise ShardMismatchError(f"the samples are not those captured at {self.folder} "
                                     "(different data or tokenisation)")

    def _shard(self, k: int) -> dict[str, torch.Tensor]:
        if k in self.loaded:
            self.loaded.move_to_end(k)
            return self.loaded[k]
        tensors = load_file(self.folder / self.manifest["shards"][k]["file"])
        self.loads += 1
        self.loaded[k] = tensors
        while len(self.loaded) > self.max_loaded:
            self.loaded.popitem(last=False)  # least recently used
        return tensors

    def entry(self, index: int) -> CaptureEntry:
        """Sample ``index``'s capture in fp32 (as the live capture returns it)."""
        k, i = self.where[index]
        t = self._shard(k)
        return CaptureEntry(t[f"{i}.aux"].float(), t[f"{i}.last_hidden"].float(),
                            t[f"{i}.argmax"])

    def capture(self, indices: list[int], width: int, device: torch.device) -> Capture:
        """Right-padded capture of samples ``indices`` (as ``CaptureCache.capture``)."""
        return padded_capture([self.entry(i) for i in indices], width, self.lm_head, device)


def shard_train_data(
    folder: str | Path,
    device: str | torch.device = "cpu",
    max_loaded: int = 2,
    source: str = "",
    heldout: bool = False,
) -> TrainData:
    """Everything ``train()`` needs from a complete capture folder, without the decoder;
    with ``heldout`` also the held-out split's samples and captures (its manifest must be
    there and complete)."""
    target = ShardTarget(folder, device)
    shards = ShardSource(folder, target, max_loaded=max_loaded)
    held = ShardSource(folder, target, max_loaded=max_loaded, split=HELDOUT) if heldout else None
    return TrainData(target, shards.samples, source=source, cache=shards,
                     heldout=held.samples if held else [], heldout_cache=held)

