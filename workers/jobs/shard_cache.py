"""The shard cache: a job's capture shards (workers/jobs/capture_stage.py, backends hf and
vllm) kept in its output bucket, so that the next job on the same target and samples trains
from them instead of running the target over every sample again (EAGLENEST_SHARD_CACHE,
default 1; 0: the cache is neither read nor written). The README's second job, for example,
trains on the first job's samples from job 1's head: with the cache it reads job 1's shards.

Where: ``<S3OutputLocation>/.eaglenest-cache/shards/<key>/`` beside the regeneration cache
(workers/jobs/regen_cache.py): the capture folder's manifests, samples files and shards of
both splits (models/capture/shards.py), then ``index.json``, written last, so a reader that
finds the index finds every file it lists. ``target/`` is not kept: the job writes it from its
own target when it plans the capture. It counts in the account's stored bytes.

Key: the sha256 (hex) of a canonical JSON of ``FORMAT``, the target's content
(regen_cache.folder_digest: every file of its folder, weights included) and each split's plan
as the capture stage wrote it (shards.IDENTITY_KEYS: shard layout version, target identity
without its path, aux layers, hidden size, dtype, samples per shard, count; and each shard's
samples with their sha256 of input ids and loss mask). Anything that changes a hidden state
changes the key; a resumed job's completed shards do not.

Index: ``{"format", "key", "job", "files": {name: {"bytes", "sha256"}}}``. A cache is used
only when the index parses, names this format and key, lists only capture file names
(``NAME``: no path, nothing else) within the bytes the plan can take (``max_bytes``), and
every file fetched has the size and sha256 listed; then its files replace the capture
folder's manifests and shards, and the capture stage checks the plan again (shards.py) and
finds every shard complete. Otherwise a warning, the target captures, and the cache is
written again. No cache problem fails the job.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglenest.foundation.store.storage import ArtifactStore, StorageError, parse_uri
from eaglenest.workers.jobs.regen_cache import canonical_line, folder_digest, hash_file

log = logging.getLogger("eaglenest.optimize")

#: the cache folder's layout; bump when it changes (old folders then miss, and are replaced)
FORMAT = 1
#: below the job's S3OutputLocation
PREFIX = ".eaglenest-cache/shards/"
INDEX = "index.json"
#: the files a capture folder's splits hold (shards.py manifest_name, samples_name,
#: shard_name): the only names an index may list
NAME = re.compile(r"(heldout-)?(manifest\.json|samples\.safetensors|shard-\d{5}\.safetensors)")
#: a manifest's keys that make its plan (the rest: which shards are complete)
PLAN_KEYS = ("format", "version", "split", "aux_layer_ids", "hidden_size", "dtype",
             "samples_per_shard", "num_samples")


class CacheError(ValueError):
    """Cached shards that cannot be used (the message says why)."""


def plan_of(manifest: dict[str, Any]) -> dict[str, Any]:
    """What of a split's manifest decides its hidden states: the plan without the target's
    path (hosts differ) or the shards' completion."""
    target = {k: v for k, v in manifest.get("target", {}).items() if k != "path"}
    shards = [{"samples": s["samples"], "sample_sha256": s["sample_sha256"]}
              for s in manifest["shards"]]
    return {**{k: manifest.get(k) for k in PLAN_KEYS}, "target": target, "shards": shards}


def cache_key(target_folder: Path, manifests: list[dict[str, Any]]) -> str:
    """The key of capturing these planned splits (their manifests) with the target in
    ``target_folder`` (module docstring)."""
    ingredients = {"format": FORMAT, "target": folder_digest(target_folder),
                   "plans": [plan_of(m) for m in manifests]}
    return hashlib.sha256(canonical_line(ingredients)).hexdigest()


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    hash_file(h, path)
    return h.hexdigest()


def parse_index(data: bytes, key: str, max_bytes: int) -> dict[str, dict[str, Any]]:
    """The index's files ({name: {"bytes", "sha256"}}); CacheError unless it names this
    FORMAT and ``key``, lists at least one manifest and only NAME files, each with a byte
    count and a sha256, together at most ``max_bytes``."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CacheError(f"its index is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CacheError(f"its index is not of format {FORMAT}")
    if doc.get("key") != key:
        raise CacheError(f"its index names another key ({str(doc.get('key'))[:16]}...)")
    files = doc.get("files")
    if not isinstance(files, dict) or "manifest.json" not in files:
        raise CacheError("its index lists no training manifest")
    for name, info in files.items():
        if not (isinstance(name, str) and NAME.fullmatch(name)):
            raise CacheError(f"its index lists {str(name)[:80]!r}, not a capture file name")
        if not (isinstance(info, dict) and isinstance(info.get("bytes"), int)
                and info["bytes"] >= 0 and isinstance(info.get("sha256"), str)):
            raise CacheError(f"its index gives {name} no byte count and sha256")
    total = sum(int(info["bytes"]) for info in files.values())
    if total > max_bytes:
        raise CacheError(f"its index lists {total} bytes, more than this capture's plan can "
                         f"take ({max_bytes})")
    return files


@dataclass
class ShardCache:
    """One job's view of the cache (``enabled``: EAGLENEST_SHARD_CACHE)."""

    store: ArtifactStore
    #: the job's S3OutputLocation
    location: str
    job: str
    enabled: bool = True

    def uri(self, key: str, name: str = "") -> str:
        return f"{self.location.rstrip('/')}/{PREFIX}{key}/{name}"

    def key(self, target_folder: str | Path | None,
            manifests: list[dict[str, Any]]) -> str | None:
        """``cache_key``, timed in the log; None with the cache off, or (a warning) when it
        cannot be made (a target without a folder, say)."""
        if not self.enabled:
            return None
        start = time.monotonic()
        try:
            if target_folder is None:
                raise ValueError("the target has no folder to hash")
            key = cache_key(Path(target_folder), manifests)
        except Exception as exc:  # a cache problem never fails the job
            log.warning("job %s: no shard cache key (%s: %s); capturing without the cache",
                        self.job, type(exc).__name__, exc)
            return None
        log.info("job %s: shard cache key %s (%.1fs to hash the target and plan)",
                 self.job, key, time.monotonic() - start)
        return key

    def fetch(self, key: str, folder: Path, max_bytes: int) -> bool:
        """Put the cached files of ``key`` into ``folder`` (over its manifests); False
        when there are none (info) or they cannot be used (a warning naming why: the
        files fetched are removed, and the caller plans the capture again)."""
        try:
            index = self.store.get_bytes(parse_uri(self.uri(key, INDEX)))
        except StorageError as exc:  # none yet (or not readable): the target captures
            log.info("job %s: no shards in the cache yet (%s)", self.job, exc)
            return False
        except Exception as exc:  # a bad cache never fails the job
            log.warning("job %s: could not read the shard cache %s (%s: %s); capturing",
                        self.job, self.uri(key), type(exc).__name__, exc)
            return False
        fetched: list[Path] = []
        try:
            files = parse_index(index, key, max_bytes)
            for name, info in sorted(files.items()):
                part = folder / f"{name}.cached"
                fetched.append(part)
                self.store.get_file(parse_uri(self.uri(key, name)), part)
                size = part.stat().st_size
                if size != info["bytes"] or file_digest(part) != info["sha256"]:
                    raise CacheError(f"{name} is not the file its index lists ({size} "
                                     f"bytes, listed {info['bytes']})")
        except Exception as exc:  # CacheError, a store error, anything else it met
            log.warning("job %s: ignoring the shard cache %s: %s; capturing (the cache "
                        "will be replaced)", self.job, self.uri(key), exc)
            for part in fetched:
                part.unlink(missing_ok=True)
            return False
        # every file checked: now they replace the folder's, the manifests last (a manifest
        # on disk never marks complete a shard that is not there yet)
        for part in sorted(fetched, key=lambda p: p.name.endswith("manifest.json.cached")):
            part.replace(part.with_name(part.name.removesuffix(".cached")))
        log.info("job %s: shards from the cache %s (%d files, %d bytes)", self.job,
                 self.uri(key), len(files), sum(int(i["bytes"]) for i in files.values()))
        return True

    def publish(self, key: str, folder: Path) -> str | None:
        """Upload the capture folder's split files, then the index; the cache's URI, or
        None (a warning: the job goes on) if that fails."""
        try:
            files: dict[str, dict[str, Any]] = {}
            for path in sorted(p for p in folder.iterdir() if NAME.fullmatch(p.name)):
                files[path.name] = {"bytes": path.stat().st_size,
                                    "sha256": file_digest(path)}
                self.store.put_file(parse_uri(self.uri(key, path.name)), path)
            index = {"format": FORMAT, "key": key, "job": self.job, "files": files}
            self.store.put_bytes(parse_uri(self.uri(key, INDEX)),
                                 json.dumps(index, indent=1).encode())
        except Exception as exc:  # a cache write never fails the job
            log.warning("job %s: could not write the shard cache %s (%s: %s)", self.job,
                        self.uri(key), type(exc).__name__, exc)
            return None
        log.info("job %s: wrote the shards to the cache %s (%d files, %d bytes)", self.job,
                 self.uri(key), len(files), sum(int(i["bytes"]) for i in files.values()))
        return self.uri(key)
