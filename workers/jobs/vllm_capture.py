"""EAGLENEST_CAPTURE_BACKEND=vllm: the capture stage's shards written by a vLLM engine.

Run as a child of the job (``python -m eaglenest.workers.jobs.vllm_capture RUN.json``,
started and reaped by workers/jobs/capture_stage.py): the job has planned the capture
folder (manifests, samples files, target/: models/capture/shards.py), and this process
fills the planned shards of each split it is given, one shard at a time, with the hidden
states vLLM's ``extract_hidden_states`` method leaves in its cache, written to files by
workers/jobs/vllm_connector.py. vLLM runs the target tensor-parallel over the GPUs it is
shown (``tensor_parallel_size``; one process on the CPU), so a target larger than one
GPU is captured; this process itself holds only the target's embeddings, lm_head and final
norm (models/target.py ``load_target_ends``), in the run's dtype: on CUDA on the first GPU
it is shown (``cuda:0``), moved there once the engine has started (the run's
``gpu_memory_utilization`` leaves them room), on the CPU in float32.

What vLLM returns and what a shard holds (models/capture/shards.py), per sample of ``seq``
tokens: vLLM is asked for layers ``aux_layer_ids + [L]`` (L = the target's layer count;
layer id k is the residual stream entering layer k, and id L the last layer's output before
the final norm), one request per sample (its input ids as the prompt, one output token),
and its file holds ``hidden_states`` [seq, n_aux + 1, hidden]. Then
    aux         = hidden_states[:, :n_aux].reshape(seq, n_aux * hidden)   # layer order
    last_hidden = final_norm(hidden_states[:, n_aux])                     # [seq, hidden]
    argmax      = lm_head(last_hidden).argmax(-1)                         # [seq]
the same tensors the transformers capture stores, equal within float tolerance (vLLM's
kernels and batching differ from transformers'; tests/workers/jobs/test_vllm_capture.py).
The last two are computed on the ends' device, ENDS_CHUNK positions at a time (a chunk's
logits are [chunk, vocab]: a 1024-token sample of a 152k vocabulary never holds its 600 MB
of float32 logits at once), and come back as CPU tensors (aux and last_hidden float32).
Prefix caching is off: every request computes all its positions.

The RUN.json keys: ``model`` (the target folder), ``folder`` (the planned capture),
``splits``, ``dtype``, ``tensor_parallel_size``, ``max_model_len``, ``device``,
``gpu_memory_utilization`` (None: vLLM's default).
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from eaglenest.models.capture.cache import CaptureEntry
from eaglenest.models.capture.shards import (
    DTYPES,
    fill_shards,
    planned_samples,
    read_manifest,
)
from eaglenest.models.target import Target, ends_to, final_norm, load_target_ends
from eaglenest.workers.jobs.capture_stage import ENDS_CHUNK
from eaglenest.workers.jobs.vllm_child import engine_base, run_child
from eaglenest.workers.jobs.vllm_connector import CONNECTOR

log = logging.getLogger("eaglenest.vllm_capture")
CONNECTOR_MODULE = "eaglenest.workers.jobs.vllm_connector"
FILES_DIR = ".vllm-hidden-states"  # vLLM's per-request files, inside the capture folder


def engine_args(run: dict[str, Any], layer_ids: list[int], files: Path) -> dict[str, Any]:
    """vLLM ``LLM(**engine_args)`` for a capture: extraction of ``layer_ids``, our connector
    writing into ``files``."""
    return {
        **engine_base(run), "max_model_len": int(run["max_model_len"]),
        "max_num_batched_tokens": max(int(run["max_model_len"]), 2048),
        "enable_prefix_caching": False,
        "speculative_config": {
            "method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}},
        },
        "kv_transfer_config": {
            "kv_connector": CONNECTOR, "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(files)},
        },
    }


class VllmEntries:
    """``fill_shards``' entries: one vLLM request per sample, read back from its file; the
    final norm, lm_head and argmax run where the target's ends are, ``rows`` positions at
    a time."""

    def __init__(self, llm: Any, target: Target, samples: list[Any],
                 rows: int = ENDS_CHUNK) -> None:
        self.llm, self.target, self.samples, self.rows = llm, target, samples, rows
        self.norm = final_norm(target.model)
        self.lm_head = target.model.get_output_embeddings()
        self.n_aux = len(target.aux_layer_ids)

    def __call__(self, ids: list[int]) -> list[CaptureEntry]:
        from vllm import SamplingParams
        from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
            cleanup_hidden_states,
            load_hidden_states,
        )
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(self.samples[i].input_ids)) for i in ids]
        outputs = self.llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0),
                                    use_tqdm=False)
        entries = []
        for i, out in zip(ids, outputs, strict=True):
            path = out.kv_transfer_params["hidden_states_path"]
            got = load_hidden_states(path)
            cleanup_hidden_states(path)
            if got["token_ids"].tolist() != list(self.samples[i].input_ids):
                raise RuntimeError(f"vLLM returned the hidden states of other tokens for "
                                   f"sample {i}")
            entries.append(self._entry(got["hidden_states"]))
        return entries

    @torch.no_grad()
    def _entry(self, states: torch.Tensor) -> CaptureEntry:
        """One sample's entry from vLLM's ``states`` [seq, n_aux + 1, hidden] (CPU)."""
        seq, _, hidden = states.shape
        aux = states[:, : self.n_aux].float().reshape(seq, self.n_aux * hidden)
        weight = self.lm_head.weight  # [vocab, hidden], on the ends' device, in their dtype
        last, argmax = [], []
        for start in range(0, seq, self.rows):
            rows = states[start:start + self.rows, self.n_aux]  # [chunk, hidden]
            normed = self.norm(rows.to(weight.device, weight.dtype))  # [chunk, hidden]
            last.append(normed.float().cpu())
            argmax.append(self.lm_head(normed).argmax(-1).cpu())  # logits [chunk, vocab]
        # aux [seq, n_aux * hidden], last_hidden [seq, hidden], argmax [seq]
        return CaptureEntry(aux, torch.cat(last), torch.cat(argmax))


def main(run_file: str) -> int:
    from vllm import LLM

    run = json.loads(Path(run_file).read_text())
    folder = Path(run["folder"])
    manifest = read_manifest(folder)
    dtype = DTYPES[manifest["dtype"]]
    target = load_target_ends(run["model"], dtype=run["dtype"],
                              aux_layer_ids=list(manifest["aux_layer_ids"]))
    files = folder / FILES_DIR
    llm = LLM(**engine_args(run, [*target.aux_layer_ids, target.num_layers], files))
    if run["device"] != "cpu":  # after the engine measured the GPUs' memory without them
        ends_to(target, "cuda:0")
    try:
        for split in run["splits"]:
            entries = VllmEntries(llm, target, planned_samples(folder, split))
            while fill_shards(folder, entries, max_new_shards=1, split=split).written:
                pass  # the manifest says which shards are done (the job polls it)
    finally:
        shutil.rmtree(files, ignore_errors=True)
    log.info("capture done: %s (%s)", folder, dtype)
    return 0


def launch(run: dict[str, Any], work: Path, on_shard: Callable[[str, dict[str, Any]], None],
           check: Callable[[], None], *, children_dir: Path | None = None, resource: str = "",
           env: dict[str, str] | None = None) -> None:
    """Run this module as an owned child over ``run`` (see the module doc) to the end
    (workers/jobs/vllm_child.py ``run_child``: ``check`` stops it), calling
    ``on_shard(split, shard)`` for every shard it completes (read from the manifests)."""
    folder = Path(run["folder"])
    seen = _complete(folder, run["splits"])

    def poll() -> None:
        nonlocal seen
        seen = _report(folder, run["splits"], seen, on_shard)

    run_child("eaglenest.workers.jobs.vllm_capture", run, work / "vllm-capture", poll, check,
              children_dir=children_dir, resource=resource, env=env)
    poll()


def _complete(folder: Path, splits: list[str]) -> set[tuple[str, str]]:
    return {(split, s["file"]) for split in splits
            for s in read_manifest(folder, split)["shards"] if s["complete"]}


def _report(folder: Path, splits: list[str], seen: set[tuple[str, str]],
            on_shard: Callable[[str, dict[str, Any]], None]) -> set[tuple[str, str]]:
    """Hand each shard completed since ``seen`` to ``on_shard``; the complete set now."""
    for split in splits:
        for shard in read_manifest(folder, split)["shards"]:
            if shard["complete"] and (split, shard["file"]) not in seen:
                on_shard(split, shard)
    return _complete(folder, splits)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main(sys.argv[1]))
