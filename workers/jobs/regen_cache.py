"""The regeneration cache: a job's regenerated examples (job_data.regenerate_both), kept in
its output bucket so that the next job on the same target, data, seed and split reuses them
instead of having the target rewrite every assistant turn again (EAGLENEST_REGENERATE_CACHE,
default 1; 0: the cache is neither read nor written).

Where: ``<S3OutputLocation>/.eaglenest-cache/regenerate/<key>.jsonl``. Every job writing to
the same S3OutputLocation shares it, on any host of the store (job names cannot start with
'.', so no job's output prefix is this one); it counts in the account's stored bytes.

Key: the sha256 (hex) of a canonical JSON of everything that decides the answers:
  - ``FORMAT`` (this file's layout) and ``models.data.regenerate.VERSION`` (bumped when
    regeneration writes other answers for the same inputs),
  - the target's content: every regular file of its fetched folder (relative path, size,
    bytes: config, tokenizer, chat template, generation config, weights), streamed in 1 MiB
    chunks; a store's size, etag or mtime is not trusted for it,
  - the examples fed to regeneration, training then held-out, in order, each as its JSON,
  - the split (training and held-out counts), the seed, regenerate's arguments
    (``job_data.REGEN_PARAMS``, or a sampled pass's: ``job_data.sample_passes``),
  - the runtime that changes greedy output: the engine (``transformers`` in the job's
    process, or ``vllm <version>`` in a child: workers/jobs/vllm_regenerate.py), device
    type, dtype, torch and transformers.

File: JSON Lines, data only (never pickle). Line 1 is the header ``{"format", "key",
"train", "holdout", "turns", "job"}``, then ``train`` training and ``holdout`` held-out
examples, each ``{"messages": [{"role", "content"}...]}`` (Chat) or ``{"prompt",
"completion"}`` (Completion). It is written with one put (a reader sees all of it or none).
It is used only when every line decodes into those types and the header's format, key and
counts match; otherwise a warning, the target regenerates and the file is overwritten. No
cache problem fails the job.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eaglenest.foundation.store.storage import ArtifactStore, StorageError, parse_uri
from eaglenest.models.data import Chat, Completion, Example
from eaglenest.workers.jobs.job_data import REGEN_PARAMS

log = logging.getLogger("eaglenest.optimize")

#: the cache file's layout; bump when it changes (old files then miss, and are replaced)
FORMAT = 1
#: below the job's S3OutputLocation
PREFIX = ".eaglenest-cache/regenerate/"
CHUNK = 1 << 20
ROLES = frozenset({"system", "user", "assistant", "tool"})

#: (training, held-out) examples
Split = tuple[list[Example], list[Example]]


class CacheError(ValueError):
    """A cache file that cannot be used (the message says why)."""


def folder_digest(folder: Path) -> str:
    """The sha256 of every regular file under `folder` (sorted relative path, size and
    content, streamed); what identifies a target whatever store it came from. Hashed once
    per process while no file's path, size or modification time changes (the regeneration
    and shard caches of one job read the same target's)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return _digest(folder, tuple((p.relative_to(folder).as_posix(), p.stat().st_size,
                                  p.stat().st_mtime_ns) for p in files))


@functools.lru_cache(maxsize=8)
def _digest(folder: Path, files: tuple[tuple[str, int, int], ...]) -> str:
    h = hashlib.sha256()
    for rel, size, _ in files:
        h.update(json.dumps([rel, size]).encode() + b"\n")
        hash_file(h, folder / rel)
    return h.hexdigest()


def hash_file(h: Any, path: Path) -> None:
    """Feed the file's bytes to the hash `h`, streamed in CHUNK pieces."""
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)


def encode(example: Example) -> dict[str, Any]:
    """An example as the JSON the readers take (OpenAI chat or completion)."""
    if isinstance(example, Chat):
        return {"messages": [{"role": m["role"], "content": m["content"]}
                             for m in example.messages]}
    return {"prompt": example.prompt, "completion": example.completion}


def decode(record: Any) -> Example:
    """`encode`'s inverse; CacheError for anything else (no other shape, no other type)."""
    fields = set(record) if isinstance(record, dict) else set()
    if fields == {"messages"} and isinstance(record["messages"], list) and all(
            isinstance(m, dict) and set(m) == {"role", "content"}
            and isinstance(m["role"], str) and m["role"] in ROLES
            and isinstance(m["content"], str) for m in record["messages"]):
        return Chat([{"role": m["role"], "content": m["content"]} for m in record["messages"]])
    if fields == {"prompt", "completion"} and all(
            isinstance(record[f], str) for f in ("prompt", "completion")):
        return Completion(record["prompt"], record["completion"])
    raise CacheError(f"not a chat or completion example: {str(record)[:80]!r}")


def canonical_line(value: Any) -> bytes:
    """`value` as one line of canonical ASCII JSON (every control and non-ASCII character
    escaped: no line breaks inside, any string encodable)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def turns(examples: Iterable[Example]) -> int:
    """The assistant turns regeneration writes for `examples` (a completion: one)."""
    return sum(1 if isinstance(e, Completion) else
               sum(m["role"] == "assistant" for m in e.messages) for e in examples)


def cache_key(target: Any, train: list[Example], holdout: list[Example], seed: int,
              engine: str, params: dict[str, Any]) -> str:
    """The key of regenerating `train` + `holdout` with `target` (module docstring)."""
    import torch
    import transformers

    from eaglenest.models.data.regenerate import VERSION

    examples = hashlib.sha256()
    for e in (*train, *holdout):
        examples.update(canonical_line(encode(e)))
    param = next(target.model.parameters())
    ingredients = {
        "format": FORMAT, "regenerate_version": VERSION,
        "target": folder_digest(Path(target.folder)), "examples": examples.hexdigest(),
        "train": len(train), "holdout": len(holdout), "seed": seed,
        "params": params,
        "runtime": {"engine": engine, "device": param.device.type, "dtype": str(param.dtype),
                    "torch": torch.__version__, "transformers": transformers.__version__},
    }
    return hashlib.sha256(canonical_line(ingredients)).hexdigest()


def dump(key: str, train: list[Example], holdout: list[Example], job: str, n: int) -> bytes:
    header = {"format": FORMAT, "key": key, "train": len(train), "holdout": len(holdout),
              "turns": n, "job": job}
    return b"".join([canonical_line(header),
                     *(canonical_line(encode(e)) for e in (*train, *holdout))])


def parse(data: bytes, key: str) -> Split:
    """`dump`'s (training, held-out) examples; CacheError unless the whole file decodes and
    its header names this FORMAT, `key` and as many examples as follow."""
    try:
        lines = [json.loads(x) for x in data.decode().split("\n") if x.strip()]
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CacheError(f"not JSON Lines ({exc})") from None
    header = lines[0] if lines else None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CacheError(f"no header of format {FORMAT}")
    if header.get("key") != key:
        raise CacheError(f"its header names another key ({str(header.get('key'))[:16]}...)")
    n_train, n_holdout = header.get("train"), header.get("holdout")
    if not (isinstance(n_train, int) and isinstance(n_holdout, int)
            and n_train >= 0 and n_holdout >= 0 and len(lines) - 1 == n_train + n_holdout):
        raise CacheError(f"the header counts {n_train} + {n_holdout} examples, "
                         f"the file holds {len(lines) - 1}")
    examples = [decode(r) for r in lines[1:]]
    return examples[:n_train], examples[n_train:]


@dataclass
class RegenCache:
    """One job's view of the cache (`enabled`: EAGLENEST_REGENERATE_CACHE): `regenerate`
    reads it, or runs the target and writes it."""

    store: ArtifactStore
    #: the job's S3OutputLocation
    location: str
    job: str
    enabled: bool = True
    #: who writes the answers (``cache_key``'s engine): transformers here, or vllm <version>
    engine: str = "transformers"
    #: regenerate's arguments (``cache_key``'s params): the greedy pass's, or a sampled one's
    params: dict[str, Any] = field(default_factory=lambda: dict(REGEN_PARAMS))

    def uri(self, key: str) -> str:
        return f"{self.location.rstrip('/')}/{PREFIX}{key}.jsonl"

    def regenerate(self, target: Any, train: list[Example], holdout: list[Example],
                   seed: int, stage: Callable[[str], None],
                   live: Callable[[], Split]) -> tuple[list[Example], list[Example],
                                                       dict[str, Any]]:
        """(training, held-out, record): the cached answers of this target, data, seed and
        split if a usable file holds them (then `stage` names the cache: no generation),
        else `live()`'s (it sets its own stage), written to the cache for the next job.
        The record is what provenance.json keeps (the Train summary's ``regeneration``):
        ``{"from_cache", "key", "uri", "turns"}``; key and uri None with the cache off (or
        no key), uri None where nothing was read or written. Only `stage` (a stop) and
        `live` raise: a cache problem is a warning and the target regenerates."""
        n = turns((*train, *holdout))
        key = None
        if self.enabled:
            stage("regenerate assistant turns: look up the regeneration cache")
            key = self._key(target, train, holdout, seed)
        if key is None:
            train, holdout = live()
            return train, holdout, {"from_cache": False, "key": None, "uri": None, "turns": n}
        uri = self.uri(key)
        cached = self._read(uri, key)
        if cached is not None:
            stage(f"regenerated answers from the cache {uri} ({n} turns)")
            return *cached, {"from_cache": True, "key": key, "uri": uri, "turns": n}
        train, holdout = live()
        written = self._write(uri, lambda: dump(key, train, holdout, self.job, n))
        return train, holdout, {"from_cache": False, "key": key,
                                "uri": uri if written else None, "turns": n}

    def _key(self, target: Any, train: list[Example], holdout: list[Example],
             seed: int) -> str | None:
        """`cache_key`, timed in the log; None (a warning: no cache) if it cannot be made."""
        start = time.monotonic()
        try:
            key = cache_key(target, train, holdout, seed, self.engine, self.params)
        except Exception as exc:  # a cache problem never fails the job
            log.warning("job %s: no regeneration cache key (%s: %s); regenerating without "
                        "the cache", self.job, type(exc).__name__, exc)
            return None
        log.info("job %s: regeneration cache key %s (%.1fs to hash the target and data)",
                 self.job, key, time.monotonic() - start)
        return key

    def _read(self, uri: str, key: str) -> Split | None:
        """The cached examples; None when there are none (info) or they cannot be used
        (a warning naming why)."""
        try:
            data = self.store.get_bytes(parse_uri(uri))
        except StorageError as exc:  # none yet (or not readable): the target regenerates
            log.info("job %s: no regenerated answers in the cache yet (%s)", self.job, exc)
            return None
        except Exception as exc:  # a bad cache never fails the job
            log.warning("job %s: could not read the regeneration cache %s (%s: %s); "
                        "regenerating", self.job, uri, type(exc).__name__, exc)
            return None
        try:
            return parse(data, key)
        except Exception as exc:  # CacheError, or anything else it met
            log.warning("job %s: ignoring the regeneration cache %s: %s; regenerating "
                        "(the file will be replaced)", self.job, uri, exc)
            return None

    def _write(self, uri: str, content: Callable[[], bytes]) -> bool:
        """One put of the whole file; False (a warning, the job goes on) if it fails."""
        try:
            data = content()
            self.store.put_bytes(parse_uri(uri), data)
        except Exception as exc:  # a cache write never fails the job
            log.warning("job %s: could not write the regeneration cache %s (%s: %s)",
                        self.job, uri, type(exc).__name__, exc)
            return False
        log.info("job %s: wrote the regenerated answers to the cache %s (%d bytes)",
                 self.job, uri, len(data))
        return True
