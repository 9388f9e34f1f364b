"""Offline target hidden states for speculators' trainer, computed with HF transformers.

    python gen_hidden_states.py MODEL DATA_DIR [--layers 2,15,27] [--dtype float32]
                                [--threads N] [--rows K]

Replaces ``speculators generate-offline-data``, which needs a running vLLM server that
extracts hidden states through a KV connector (speculators/cli/generate_offline_data.py:250-325).
For dataset row i (the first ``--rows`` rows; default all) it writes
DATA_DIR/hidden_states/hs_{i}.safetensors holding

* ``token_ids``: [T] int64, equal to the row's input_ids (checked by
  speculators/train/data.py:314),
* ``hidden_states``: [T, len(layers) + 1, H]: the input of each target decoder layer in
  ``--layers`` (vLLM's aux-hidden-state convention, the same as EagleNest's
  models/target.py), then the *pre-norm* output of the last decoder layer. The trainer
  splits them as ``[:, :-1]`` (aux) and ``[:, -1]`` (verifier_last_hidden_states,
  train/data.py:325-331) and applies the verifier's final norm itself
  (speculators/models/eagle3/core.py: ``verifier_lm_head(verifier_norm(...))``).

Prints a JSON line with the rows written, tokens and wall / CPU seconds.
"""

import argparse
import json
import time
from pathlib import Path

import torch
from datasets import load_from_disk
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("--layers", default="2,15,27")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t0, c0 = time.perf_counter(), time.process_time()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    layers = [int(x) for x in a.layers.split(",")]
    last = len(model.model.layers) - 1
    ds = load_from_disk(a.data).with_format("torch")
    out = Path(a.data) / "hidden_states"
    out.mkdir(exist_ok=True)
    grabbed: dict[object, torch.Tensor] = {}

    def pre_hook(k: int):  # noqa: ANN202
        def hook(mod, args, kwargs):  # noqa: ANN001, ANN202
            grabbed[k] = args[0] if args else kwargs["hidden_states"]
        return hook

    def post_hook(mod, args, output):  # noqa: ANN001, ANN202
        grabbed["final"] = output[0] if isinstance(output, tuple) else output

    for k in layers:
        model.model.layers[k].register_forward_pre_hook(pre_hook(k), with_kwargs=True)
    model.model.layers[last].register_forward_hook(post_hook)
    rows = len(ds) if a.rows is None else min(a.rows, len(ds))
    tokens = 0
    with torch.inference_mode():
        for i in range(rows):
            ids = ds[i]["input_ids"].long()
            grabbed.clear()
            model.model(input_ids=ids[None], use_cache=False)
            feats = [grabbed[k][0] for k in layers] + [grabbed["final"][0]]
            stack = torch.stack(feats, dim=1).to(getattr(torch, a.dtype))
            save_file({"token_ids": ids.contiguous(), "hidden_states": stack.contiguous()},
                      str(out / f"hs_{i}.safetensors"))
            tokens += int(ids.numel())
    print(json.dumps({"rows": rows, "tokens": tokens, "layers": layers,
                      "wall_s": time.perf_counter() - t0,
                      "cpu_s": time.process_time() - c0}))


if __name__ == "__main__":
    main()
