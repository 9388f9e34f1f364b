"""EAGLENEST_REGENERATE with the vLLM capture backend: the target's answers written by a vLLM
engine in an owned child process, so a job that captures with vLLM never runs the target in
its own process.

Run as ``python -m eaglenest.workers.jobs.vllm_regenerate RUN.json`` (started, watched and
reaped by workers/jobs/vllm_child.py ``run_child``; ``regenerate`` below is the job's side).
The examples travel as JSON lines in the regeneration cache's encoding
(workers/jobs/regen_cache.py ``encode``/``decode``), both ways. The child drives
models/data/regenerate.py ``regenerate_by``: round r sends turn r of every example that
has one to the engine, CHUNK requests at a time, each with the seed ``regenerate`` gives
that turn (``seed + 1000 * example + turn``; greedy at temperature 0), the stop ids of the
target's generation config (vLLM's default), ``max_new_tokens`` at most; after each chunk it
rewrites the progress file (``done total``), which the job reads for its progress lines and
stop checks.

The RUN.json keys: ``model``, ``examples`` (input JSON lines), ``out`` (output JSON lines),
``progress``, ``seed``, ``max_new_tokens``, ``temperature``, ``dtype``,
``tensor_parallel_size``, ``device``.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eaglenest.models.data.readers import Example
from eaglenest.models.data.regenerate import regenerate_by
from eaglenest.workers.jobs.regen_cache import decode, encode, turns
from eaglenest.workers.jobs.vllm_child import engine_base, run_child

log = logging.getLogger("eaglenest.vllm_regenerate")
CHUNK = 64  # requests per generate call: the progress file's grain


def _write_lines(path: Path, examples: list[Example]) -> None:
    path.write_text("".join(json.dumps(encode(e)) + "\n" for e in examples))


def _read_lines(path: Path) -> list[Example]:
    return [decode(json.loads(line)) for line in path.read_text().splitlines() if line]


def regenerate(examples: list[Example], run: dict[str, Any], stem: Path,
               progress: Callable[[int, int], None], *,
               check: Callable[[], None] = lambda: None, children_dir: Path | None = None,
               resource: str = "", env: dict[str, str] | None = None) -> list[Example]:
    """Every example with its assistant turns rewritten by a vLLM child (empty ones kept,
    as ``regenerate(keep_empty=True)``); ``progress(done, total)`` as the child reports;
    ``check()`` between polls (also while the engine starts); whatever either raises (a
    stop) stops the child. ``run`` holds the engine's keys (module doc); the files go
    beside ``stem``."""
    files = {"examples": stem.with_suffix(".in.jsonl"), "out": stem.with_suffix(".out.jsonl"),
             "progress": stem.with_suffix(".progress")}
    _write_lines(files["examples"], examples)
    for name in ("out", "progress"):
        files[name].unlink(missing_ok=True)
    seen = ""

    def poll() -> None:
        nonlocal seen
        text = files["progress"].read_text() if files["progress"].is_file() else ""
        if text and text != seen:
            seen = text
            done, total = (int(x) for x in text.split())
            progress(done, total)

    run_child("eaglenest.workers.jobs.vllm_regenerate",
              {**run, **{k: str(v) for k, v in files.items()}}, stem, poll, check,
              children_dir=children_dir, resource=resource, env=env)
    poll()
    return _read_lines(files["out"])


def main(run_file: str) -> int:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    run = json.loads(Path(run_file).read_text())
    llm = LLM(**engine_base(run))
    tokenizer = llm.get_tokenizer()
    seed, progress_file = int(run["seed"]), Path(run["progress"])
    examples = _read_lines(Path(run["examples"]))
    written = [0, turns(examples)]  # turns done, turns in all

    def generate(asked: list[tuple[int, int, list[int]]]) -> list[str]:
        texts: list[str] = []
        for start in range(0, len(asked), CHUNK):
            chunk = asked[start:start + CHUNK]
            params = [SamplingParams(max_tokens=int(run["max_new_tokens"]),
                                     temperature=float(run["temperature"]),
                                     seed=seed + 1000 * i + turn, skip_special_tokens=True)
                      for i, turn, _ in chunk]
            outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for _, _, ids in chunk],
                                   params, use_tqdm=False)
            texts += [o.outputs[0].text for o in outputs]
            written[0] += len(chunk)
            progress_file.write_text(f"{written[0]} {written[1]}")
        return texts

    out = regenerate_by(examples, tokenizer, generate, keep_empty=True)
    _write_lines(Path(run["out"]), out)
    log.info("regenerated %d turns of %d examples", written[0], len(examples))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main(sys.argv[1]))
