"""Capture speed and memory per backend: the job's capture stage (workers/jobs/capture_stage.py)
writing shards of the same samples with transformers in this process (``hf``) and with a
vLLM child (``vllm``), at the data once and repeated (``--repeat``), each row in a fresh
process so its peak memory is its own.

    python -m benchmarks.capture_backends [--target DIR] [--backends hf,vllm]
        [--repeat 1,10] [--max-length 256] [--per-shard 16] [--threads 2]

Data: every built-in dataset (the README's train.jsonl), encoded at ``--max-length``, then
repeated N times for the ``xN`` rows. Columns: wall seconds of ``capture()`` (for vllm
including the engine's start), tokens/s over that wall, peak RSS of the row's process
(the job's side: it holds the whole target for hf, only its ends for vllm), of the vLLM
capture child and of the largest vLLM engine process under it (``Peaks``), and the
shards' bytes.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _row(target_dir: Path, backend: str, repeat: int, max_length: int, per_shard: int,
         threads: int) -> dict[str, Any]:
    import torch

    from eaglenest.models.data import BUILTIN_NAMES, encode_examples, load_examples
    from eaglenest.models.target import load_target, load_target_ends
    from eaglenest.workers.jobs import capture_stage

    torch.set_num_threads(threads)
    target = load_target_ends(target_dir) if backend == "vllm" else load_target(target_dir)
    examples = [e for name in BUILTIN_NAMES for e in load_examples(name)]
    samples = encode_examples(examples, target.tokenizer, max_length) * repeat
    tokens = sum(len(s.input_ids) for s in samples)
    with tempfile.TemporaryDirectory() as work:
        vllm = (capture_stage.VllmCapture(target_dir, "cpu", 1, max_length + 8, Path(work))
                if backend == "vllm" else None)
        peaks = Peaks()
        start = time.perf_counter()
        info = capture_stage.capture(Path(work) / "capture", target, samples, per_shard,
                                     "bench", lambda r: None, peaks.sample, None, vllm)
        wall = time.perf_counter() - start
    return {"backend": backend, "repeat": repeat, "samples": len(samples), "tokens": tokens,
            "wall_s": wall, "tokens_per_s": tokens / wall, "bytes": info.bytes,
            "self_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "child_peak_mib": peaks.peak.get("capture child", 0) / 2**20,
            "engine_peak_mib": peaks.peak.get("engine", 0) / 2**20}


class Peaks:
    """Peak RSS of this process's descendants by role, sampled at every stop check of the
    capture (every 0.5 s while a vLLM child runs): ``capture child`` (the process running
    workers/jobs/vllm_capture.py: the target's ends, one shard's tensors) and ``engine``
    (the largest of vLLM's processes under it: weights, KV cache)."""

    def __init__(self) -> None:
        self.peak: dict[str, int] = {}

    def sample(self) -> None:
        import psutil

        for proc in psutil.Process().children(recursive=True):
            try:
                role = ("capture child" if "vllm_capture" in " ".join(proc.cmdline())
                        else "engine")
                rss = proc.memory_info().rss
            except psutil.Error:
                continue
            self.peak[role] = max(self.peak.get(role, 0), rss)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, default=None)
    p.add_argument("--backends", default="hf,vllm")
    p.add_argument("--repeat", default="1,10")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--per-shard", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # backend:repeat, one row
    a = p.parse_args(argv)
    if a.target is None:
        from eaglenest.models.prepare import cached_smollm2

        a.target = cached_smollm2()
    if a.row:
        backend, repeat = a.row.split(":")
        print(json.dumps(_row(a.target, backend, int(repeat), a.max_length, a.per_shard,
                              a.threads)))
        return 0
    print("| backend | data | samples | tokens | wall s | tokens/s | peak RSS job MiB "
          "| vLLM child MiB | vLLM engine MiB | shards MB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for repeat in (int(r) for r in a.repeat.split(",")):
        for backend in a.backends.split(","):  # rows interleaved
            cmd = [sys.executable, "-m", "benchmarks.capture_backends", "--row",
                   f"{backend}:{repeat}", "--target", str(a.target), "--max-length",
                   str(a.max_length), "--per-shard", str(a.per_shard),
                   "--threads", str(a.threads)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"| {backend} | x{repeat} | {r['samples']} | {r['tokens']} | "
                  f"{r['wall_s']:.1f} | {r['tokens_per_s']:.0f} | {r['self_peak_mib']:.0f} | "
                  f"{r['child_peak_mib']:.0f} | {r['engine_peak_mib']:.0f} | "
                  f"{r['bytes'] / 1e6:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
