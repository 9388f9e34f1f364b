"""Target captures written once to disk as safetensors shards, so a head can be trained from
files, on another machine and without the target's decoder (models/training/shard_source.py reads
them). ``write_shards(target, samples, folder, samples_per_shard)`` lays out:

    manifest.json              format version, target identity, the plan of shards and which
                               of them are complete (see ``plan``)
    samples.safetensors        every sample's input ids and loss mask (``samples_file``):
                               what a reader needs of the samples without opening a shard
    shard-00000.safetensors    samples 0..N-1; per sample i (its index in ``samples``):
                                 "i.aux"         [seq, n_aux * hidden]  (manifest dtype)
                                 "i.last_hidden" [seq, hidden]          (manifest dtype)
                                 "i.argmax"      [seq] int64  the target's greedy next token
                                 "i.input_ids"   [seq] int64, "i.loss_mask" [seq] uint8
    shard-00001.safetensors    samples N..2N-1, and so on; the last shard may be shorter
    target/                    what training needs of the target besides the captures:
                               its config and tokenizer (save_pretrained) and ends.safetensors
                               ("embed" [vocab, hidden], "lm_head" [vocab, hidden] unless
                               tied to the embeddings, "lm_head_bias" [vocab] if any)
    heldout-manifest.json,     the held-out split (``split="heldout"``): samples never trained
    heldout-samples.safetensors, on, for the held-out accuracy; the same layout and rules
    heldout-shard-00000.safetensors, ...  with their own indices from 0 (shares target/)

Each sample is captured alone (batch 1) through ``CaptureCache.entry``, so a shard holds
exactly what the in-process cache would: training from shards is the same run. Logits are
not stored (a 128k vocabulary is ~130 MB per 256-token sample); like the cache, readers
recompute them from ``last_hidden`` with the lm_head in target/.

Resume and refusal: the manifest is written first with every shard planned and none
complete; a shard is written to a temporary file, renamed into place, and only then marked
complete, so a capture killed at any point resumes by skipping the complete shards. A
manifest whose target (config.json hash, folder name, architecture), aux layers, hidden
size, dtype, shard size or samples (a hash of each sample's input ids and loss mask)
differ from this call's is refused with ``ShardMismatchError``, never reused. Each split
has its own manifest, checked and resumed on its own.

Memory: one shard's tensors (and their serialised bytes while written) at a time, whatever
the number of samples.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from eaglenest.models.capture.cache import CaptureCache, CaptureEntry
from eaglenest.models.data.template import Sample
from eaglenest.models.target import Target

FORMAT = "eaglenest-capture-shards"
VERSION = 2  # 2: samples.safetensors, splits
MANIFEST = "manifest.json"  # the training split's
TRAIN, HELDOUT = "train", "heldout"  # the splits; files of any but TRAIN carry its prefix
TARGET_DIR = "target"  # config, tokenizer and ends.safetensors
ENDS = "ends.safetensors"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: manifest keys that must be equal for an existing capture to be reused
IDENTITY_KEYS = ("format", "version", "split", "target", "aux_layer_ids", "hidden_size",
                 "dtype", "samples_per_shard", "num_samples")


class ShardMismatchError(ValueError):
    """A capture folder made for another target, other samples or other settings."""


class IncompleteCaptureError(ValueError):
    """A capture folder some of whose shards are not written yet."""


@dataclass
class ShardReport:
    folder: Path
    shards: int  # planned in all
    written: list[int] = field(default_factory=list)  # shard numbers written by this call
    skipped: list[int] = field(default_factory=list)  # complete before this call
    forwards: int = 0  # target forwards run by this call (one per sample written)
    bytes: int = 0  # bytes of the shards written by this call


def _prefix(split: str) -> str:
    if split not in (TRAIN, HELDOUT):
        raise ValueError(f"unknown split {split!r}: {TRAIN} or {HELDOUT}")
    return "" if split == TRAIN else f"{split}-"


def shard_name(k: int, split: str = TRAIN) -> str:
    """shard-00003.safetensors; heldout-shard-00003.safetensors for the held-out split."""
    return f"{_prefix(split)}shard-{k:05d}.safetensors"


def manifest_name(split: str = TRAIN) -> str:
    return _prefix(split) + MANIFEST


def samples_name(split: str = TRAIN) -> str:
    return f"{_prefix(split)}samples.safetensors"


def samples_file(samples: list[Sample]) -> bytes:
    """The samples' input ids and loss masks, concatenated, with each sample's bounds:
    "input_ids" [tokens] int64, "loss_mask" [tokens] uint8, "offsets" [samples + 1] int64
    (sample i is ``offsets[i]:offsets[i + 1]``).

    Example: samples [5, 6, 7] and [8, 9] -> input_ids [5, 6, 7, 8, 9], offsets [0, 3, 5].
    """
    lengths = [len(s.input_ids) for s in samples]
    return save({
        "input_ids": torch.tensor([t for s in samples for t in s.input_ids],
                                  dtype=torch.int64),  # [tokens]
        "loss_mask": torch.tensor([m for s in samples for m in s.loss_mask],
                                  dtype=torch.uint8),  # [tokens]
        "offsets": torch.tensor([0, *itertools.accumulate(lengths)],
                                dtype=torch.int64),  # [samples + 1]
    })


def sample_hash(sample: Sample) -> str:
    """sha256 of the sample's input ids then its loss mask, as little-endian int64."""
    h = hashlib.sha256()
    for seq in (sample.input_ids, sample.loss_mask):
        h.update(torch.tensor(seq, dtype=torch.int64).numpy().tobytes())
        h.update(b"|")  # so ([1, 2], [3]) and ([1], [2, 3]) differ
    return h.hexdigest()


def target_identity(target: Target) -> dict[str, str]:
    """Name, architecture and config.json hash (the saved file; else the in-memory config)."""
    folder = target.folder
    if folder is not None and (Path(folder) / "config.json").is_file():
        raw = (Path(folder) / "config.json").read_bytes()
    else:
        raw = json.dumps(target.config.to_dict(), sort_keys=True).encode()
    return {
        "name": Path(folder).name if folder is not None else "",
        "path": str(folder or ""),  # informative only: not compared (hosts differ)
        "architecture": target.architecture,
        "config_sha256": hashlib.sha256(raw).hexdigest(),
    }


def plan(target: Target, samples: list[Sample], samples_per_shard: int,
         dtype: torch.dtype, split: str = TRAIN) -> dict[str, Any]:
    """The manifest of a capture not started yet: every shard planned, none complete.

    Example: 5 samples, samples_per_shard=2 -> shards [0, 1], [2, 3], [4].
    """
    if samples_per_shard < 1 or not samples:
        raise ValueError("need samples and samples_per_shard >= 1")
    names = {v: k for k, v in DTYPES.items()}
    if dtype not in names:
        raise ValueError(f"dtype {dtype} not one of {sorted(DTYPES)}")
    shards = []
    for k, start in enumerate(range(0, len(samples), samples_per_shard)):
        ids = list(range(start, min(start + samples_per_shard, len(samples))))
        shards.append({"file": shard_name(k, split), "samples": ids,
                       "sample_sha256": [sample_hash(samples[i]) for i in ids],
                       "complete": False})
    return {
        "format": FORMAT,
        "version": VERSION,
        "split": split,
        "target": target_identity(target),
        "aux_layer_ids": list(target.aux_layer_ids),
        "hidden_size": target.hidden_size,
        "dtype": names[dtype],
        "samples_per_shard": samples_per_shard,
        "num_samples": len(samples),
        "shards": shards,
    }


def read_manifest(folder: str | Path, split: str = TRAIN) -> dict[str, Any]:
    path = Path(folder) / manifest_name(split)
    if not path.is_file():
        raise FileNotFoundError(f"no capture manifest at {path}")
    manifest: dict[str, Any] = json.loads(path.read_text())
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ShardMismatchError(f"{path}: format {manifest.get('format')!r} version "
                                 f"{manifest.get('version')!r}, expected {FORMAT!r} {VERSION}")
    return manifest


def check_same_plan(old: dict[str, Any], new: dict[str, Any], where: str | Path) -> None:
    """Raise ShardMismatchError naming the first field in which two plans differ."""
    for key in IDENTITY_KEYS:
        a, b = old.get(key), new.get(key)
        if key == "target":  # the path may differ between hosts; the rest may not
            a = {k: v for k, v in (a or {}).items() if k != "path"}
            b = {k: v for k, v in (b or {}).items() if k != "path"}
        if a != b:
            raise ShardMismatchError(
                f"capture at {where} was made with {key}={a!r}, this run has {b!r}: "
                "use another folder or delete it")
    for k, (s, t) in enumerate(zip(old["shards"], new["shards"], strict=True)):
        if s["samples"] != t["samples"] or s["sample_sha256"] != t["sample_sha256"]:
            raise ShardMismatchError(
                f"capture at {where}: shard {k} holds other samples (different data or "
                "tokenisation): use another folder or delete it")


def atomic_write(path: Path, data: bytes) -> None:
    """Write then rename: readers see the old file or the whole new one, never a part."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    atomic_write(folder / manifest_name(manifest["split"]),
                 json.dumps(manifest, indent=1).encode())


def _open_plan(out: Path, manifest: dict[str, Any], samples: list[Sample]) -> dict[str, Any]:
    """The manifest to continue: the one in ``out`` if it has this plan (else
    ShardMismatchError), or ``manifest``, written after the samples file (so a manifest
    on disk always has its samples file)."""
    split = manifest["split"]
    if (out / manifest_name(split)).is_file():
        old = read_manifest(out, split)
        check_same_plan(old, manifest, out if split == TRAIN else f"{out} ({split} split)")
        return old
    atomic_write(out / samples_name(split), samples_file(samples))
    _write_manifest(out, manifest)
    return manifest


def _write_target_files(target: Target, out: Path) -> None:
    """Config, tokenizer and the embedding / lm_head weights (once per folder)."""
    if (out / ENDS).is_file():
        return
    out.mkdir(parents=True, exist_ok=True)
    target.config.save_pretrained(out)
    target.tokenizer.save_pretrained(out)
    head = target.model.get_output_embeddings()
    embed = target.embed_weight()
    ends = {"embed": embed.detach().cpu().contiguous()}
    if head.weight.data_ptr() != embed.data_ptr():  # untied: its own matrix
        ends["lm_head"] = head.weight.detach().cpu().contiguous()
    if getattr(head, "bias", None) is not None:
        ends["lm_head_bias"] = head.bias.detach().cpu().contiguous()
    atomic_write(out / ENDS, save(ends, metadata={"tied": str("lm_head" not in ends)}))


#: computes the captures of the samples at these indices, in order (``fill_shards``)
Entries = Callable[[list[int]], list[CaptureEntry]]


def _shard_tensors(entries: list[CaptureEntry], samples: list[Sample], ids: list[int],
                   dtype: torch.dtype) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for i, e in zip(ids, entries, strict=True):
        s = samples[i]
        tensors[f"{i}.aux"] = e.aux.to(dtype).contiguous()  # [seq, n_aux * hidden]
        tensors[f"{i}.last_hidden"] = e.last_hidden.to(dtype).contiguous()  # [seq, hidden]
        tensors[f"{i}.argmax"] = e.argmax.to(torch.int64).contiguous()  # [seq]
        tensors[f"{i}.input_ids"] = torch.tensor(s.input_ids, dtype=torch.int64)  # [seq]
        tensors[f"{i}.loss_mask"] = torch.tensor(s.loss_mask, dtype=torch.uint8)  # [seq]
    return tensors


def write_shards(
    target: Target,
    samples: list[Sample],
    folder: str | Path,
    samples_per_shard: int = 64,
    *,
    dtype: torch.dtype = torch.float32,
    autocast: contextlib.AbstractContextManager | None = None,
    max_new_shards: int | None = None,
    split: str = TRAIN,
) -> ShardReport:
    """Capture ``samples`` into ``folder`` as ``split`` (TRAIN or HELDOUT), resuming a
    capture of the same plan there.

    ``max_new_shards`` stops after writing that many shards (a time-sliced capture; call
    again to continue; 0 plans the capture and writes target/ only). Raises
    ShardMismatchError for a folder of another plan.
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    _open_plan(out, plan(target, samples, samples_per_shard, dtype, split), samples)
    _write_target_files(target, out / TARGET_DIR)
    device = next(target.model.parameters()).device
    cache = CaptureCache(target, samples, budget_bytes=0, autocast=autocast)
    return fill_shards(out, lambda ids: [cache.entry(i, device) for i in ids],
                       max_new_shards=max_new_shards, split=split)


def planned_samples(folder: str | Path, split: str = TRAIN) -> list[Sample]:
    """Every sample of a planned capture's ``split`` (complete or not), from its samples
    file (``samples_file``), in index order."""
    t = load_file(Path(folder) / samples_name(split))
    ids, mask = t["input_ids"].tolist(), t["loss_mask"].tolist()  # [tokens] each
    bounds = t["offsets"].tolist()  # [samples + 1]: sample i is bounds[i]:bounds[i + 1]
    return [Sample(ids[a:b], mask[a:b]) for a, b in itertools.pairwise(bounds)]


def fill_shards(folder: str | Path, entries: Entries, *, max_new_shards: int | None = None,
                split: str = TRAIN) -> ShardReport:
    """Write the shards a planned ``split`` in ``folder`` lacks, one at a time, each from
    ``entries(its sample indices)``: the transformers target (``write_shards``) or another
    engine's capture of the same samples (workers/jobs/vllm_capture.py). A shard is
    marked complete in the manifest only once its file is in place."""
    out = Path(folder)
    manifest = read_manifest(out, split)
    samples = planned_samples(out, split)
    dtype = DTYPES[manifest["dtype"]]
    report = ShardReport(out, len(manifest["shards"]))
    for k, shard in enumerate(manifest["shards"]):
        if shard["complete"] and (out / shard["file"]).is_file():
            report.skipped.append(k)
            continue
        if max_new_shards is not None and len(report.written) >= max_new_shards:
            break
        ids = shard["samples"]
        data = save(_shard_tensors(entries(ids), samples, ids, dtype),
                    metadata={"format": "pt", "shard": str(k)})
        atomic_write(out / shard["file"], data)
        shard["complete"], shard["bytes"] = True, len(data)
        _write_manifest(out, manifest)  # only now is the shard part of the capture
        report.written.append(k)
        report.forwards += len(ids)
        report.bytes += len(data)
    return report
