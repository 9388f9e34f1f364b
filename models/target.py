"""Load a target model from a local folder and capture what the draft heads consume.

One forward pass of the target yields, per token position t:

* ``aux``: the residual stream *entering* target layers ``aux_layer_ids`` (vLLM's
  ``eagle_aux_hidden_state_layer_ids`` convention: id k = input of layer k), concatenated
  on the last dimension -> ``[batch, seq, n_aux * hidden]``. EAGLE-3 / P-EAGLE fuse these.
* ``last_hidden``: the base model's final output, *after* the final norm -> ``[batch, seq,
  hidden]``. This is what vLLM hands an EAGLE-1/2 draft (the target model's returned
  hidden states) and what the original EAGLE trains against; ``lm_head(last_hidden)`` are
  the target logits.
* ``logits``: the target's next-token logits ``[batch, seq, vocab]``.

A target loads in the dtype it is given (a torch dtype or its name: ``float32``,
``bfloat16``, ``float16``): float32 on the CPU (exact), the job's GPU dtype on CUDA
(workers/jobs/job_target.py). ``release_gpu_memory()`` hands what a dropped target held on
a GPU back to the driver, for the processes that come after it.
"""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eaglenest.models.heads.registry import EAGLE, EAGLE3

REQUIRED_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
)
WEIGHT_FILE = "model.safetensors"
WEIGHT_INDEX = "model.safetensors.index.json"
#: the dtypes a target loads in, by name (foundation/dtypes.py's internal values)
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                "float16": torch.float16}


@dataclass(frozen=True)
class ArchitectureSupport:
    """What EagleNest trains for one target architecture."""

    architecture: str
    #: the default head kind (models/heads/registry.py); heads of the same vLLM method
    #: (EAGLE-3: also P-EAGLE) suit it too, and a kind without aux states suits every target
    head: str


SUPPORTED_ARCHITECTURES: dict[str, ArchitectureSupport] = {
    a.architecture: a
    for a in (
        ArchitectureSupport("LlamaForCausalLM", EAGLE3.kind),
        ArchitectureSupport("Qwen2ForCausalLM", EAGLE3.kind),
        ArchitectureSupport("Qwen3ForCausalLM", EAGLE3.kind),
        ArchitectureSupport("Qwen3MoeForCausalLM", EAGLE3.kind),
        ArchitectureSupport("GptOssForCausalLM", EAGLE3.kind),
        ArchitectureSupport("Qwen3NextForCausalLM", EAGLE.kind),
    )
}


class TargetError(ValueError):
    """A target folder that cannot be used (missing files, unsupported architecture)."""


class UnsupportedArchitectureError(TargetError):
    pass


class MissingModelFilesError(TargetError):
    def __init__(self, folder: Path, missing: list[str]) -> None:
        self.missing = missing
        super().__init__(f"model folder {folder} is missing required files: {', '.join(missing)}")


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """vLLM's default EAGLE-3 aux layers: (2, L // 2, L - 3).

    Example: L = 30 (SmolLM2-135M) -> [2, 15, 27]; L = 8 (tiny tests) -> [2, 4, 5].
    """
    return [2, num_layers // 2, num_layers - 3]


def check_model_files(folder: str | Path) -> None:
    """Raise MissingModelFilesError listing every required file that is absent."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingModelFilesError(folder, [f"{folder} (not a directory)"])
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    missing.extend(_missing_weights(folder))
    if missing:
        raise MissingModelFilesError(folder, missing)


def _missing_weights(folder: Path) -> list[str]:
    if (folder / WEIGHT_FILE).is_file():
        return []
    index = folder / WEIGHT_INDEX
    if not index.is_file():
        has_bin = any(folder.glob("*.bin"))
        note = " (only .bin weights found; safetensors required)" if has_bin else ""
        return [f"{WEIGHT_FILE} or {WEIGHT_INDEX}{note}"]
    shards = set(json.loads(index.read_text())["weight_map"].values())
    return sorted(s for s in shards if not (folder / s).is_file())


def read_architecture(folder: str | Path) -> tuple[str, ArchitectureSupport]:
    """Return (architecture, support row); UnsupportedArchitectureError if not in the table."""
    config = json.loads((Path(folder) / "config.json").read_text())
    archs = config.get("architectures") or []
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return arch, SUPPORTED_ARCHITECTURES[arch]
    supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
    raise UnsupportedArchitectureError(
        f"unsupported target architecture {archs or '(none in config.json)'}; "
        f"supported: {supported}"
    )


@dataclass
class Capture:
    """Tensors from one target forward pass (no grad).

    A live capture carries the full ``logits``; a cached one (models.capture.cache) keeps
    only the hidden states plus the target's argmax and recomputes the logits it needs
    from ``last_hidden`` with ``lm_head``: the draft-vocabulary heads need only 8k of the
    vocabulary's columns, so caching them all (100 MB per 512-token sample) is not needed.
    """

    aux: torch.Tensor  # [batch, seq, n_aux * hidden]
    last_hidden: torch.Tensor  # [batch, seq, hidden] (after the final norm)
    logits: torch.Tensor | None = None  # [batch, seq, vocab]
    lm_head: nn.Module | None = None  # the target's output projection (hidden -> vocab)
    argmax: torch.Tensor | None = None  # [batch, seq] long: the target's greedy next token

    def full_logits(self) -> torch.Tensor:  # [batch, seq, vocab]
        if self.logits is not None:
            return self.logits
        if self.lm_head is None:
            raise ValueError("capture has neither logits nor an lm_head")
        weight = getattr(self.lm_head, "weight", None)  # a half-precision target's lm_head
        hidden = self.last_hidden if weight is None else self.last_hidden.to(weight.dtype)
        with torch.no_grad():
            return self.lm_head(hidden).float()

    def logits_for(self, rows: torch.Tensor) -> torch.Tensor:
        """Logits of the target ids ``rows`` [n] only: [batch, seq, n]."""
        if self.logits is not None:
            return self.logits[..., rows]
        if not isinstance(self.lm_head, nn.Linear):
            return self.full_logits()[..., rows]
        bias = None if self.lm_head.bias is None else self.lm_head.bias[rows]
        with torch.no_grad():
            w = self.lm_head.weight[rows].to(self.last_hidden.dtype)
            return nn.functional.linear(self.last_hidden, w, bias).float()

    def target_argmax(self) -> torch.Tensor:  # [batch, seq] long
        return self.argmax if self.argmax is not None else self.full_logits().argmax(-1)


class Target:
    """A loaded target model (eval mode, frozen) plus its tokenizer."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        folder: Path | None,
        architecture: str,
        aux_layer_ids: list[int] | None = None,
    ) -> None:
        #: a transformers causal LM; its submodules (model.layers, the embeddings) differ by
        #: architecture, so it is used duck-typed
        self.model: Any = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.folder = folder
        self.architecture = architecture
        self.support = SUPPORTED_ARCHITECTURES[architecture]
        self.config: Any = model.config  # the transformers config of the architecture
        self.aux_layer_ids = aux_layer_ids or default_aux_layer_ids(self.num_layers)
        ids = self.aux_layer_ids
        if any(not 0 <= k < self.num_layers for k in ids) or ids != sorted(set(ids)):
            # vLLM appends aux states in layer order, once per layer: the ids must be
            # strictly increasing or the fused width / order would not match at serve time.
            raise TargetError(
                f"aux layer ids {ids} must be strictly increasing within 0..{self.num_layers - 1}"
                " (targets need at least 8 layers for the default (2, L//2, L-3))"
            )

    @property
    def num_layers(self) -> int:
        return len(self.decoder_layers)

    @property
    def decoder_layers(self) -> nn.ModuleList:
        return self.model.model.layers

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def embed_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight  # [vocab, hidden]

    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight  # [vocab, hidden]

    @torch.no_grad()
    def capture(
        self,
        input_ids: torch.Tensor,  # [batch, seq]
        attention_mask: torch.Tensor | None = None,  # [batch, seq] 1 = real token
    ) -> Capture:
        grabbed: dict[int, torch.Tensor] = {}
        hooks = []
        for k in sorted(set(self.aux_layer_ids)):
            hooks.append(
                self.decoder_layers[k].register_forward_pre_hook(
                    _grab_input(grabbed, k), with_kwargs=True
                )
            )
        try:
            out = self.model.model(input_ids=input_ids, attention_mask=attention_mask)
        finally:
            for h in hooks:
                h.remove()
        last = out.last_hidden_state
        logits = self.model.get_output_embeddings()(last)
        aux = torch.cat([grabbed[k] for k in self.aux_layer_ids], dim=-1)
        return Capture(aux=aux.float(), last_hidden=last.float(), logits=logits.float())


def _grab_input(store: dict[int, torch.Tensor], k: int):  # noqa: ANN202 - hook factory
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        store[k] = (args[0] if args else kwargs["hidden_states"]).detach()

    return hook


def torch_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``dtype`` itself, or the torch dtype of one of TORCH_DTYPES' names."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[dtype]


def release_gpu_memory() -> bool:
    """After a process dropped a target it held on a GPU (``del target``, or
    ``target.model.to("cpu")``): collect it, and hand the blocks torch's caching allocator
    kept back to the driver, so the processes that come next (torchrun's ranks, the
    benchmark's servers) find that memory free. Touches no GPU when this process never
    initialised CUDA. True when the cache was emptied."""
    gc.collect()
    if not torch.cuda.is_initialized():
        return False
    torch.cuda.empty_cache()
    return True


def load_target(
    folder: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float32,
    aux_layer_ids: list[int] | None = None,
) -> Target:
    """Load a target from a local folder in ``dtype`` (float32: exact; on a GPU the job's
    dtype): safetensors only, trust_remote_code off."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch_dtype(dtype)
    folder = Path(folder)
    check_model_files(folder)
    arch, _ = read_architecture(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype, trust_remote_code=False, use_safetensors=True
    )
    model.to(device)  # type: ignore[arg-type]  # transformers types to() as taking a model
    return Target(model, tokenizer, folder, arch, aux_layer_ids)


def load_target_ends(
    folder: str | Path,
    dtype: torch.dtype | str = torch.float32,
    aux_layer_ids: list[int] | None = None,
) -> Target:
    """A target whose decoder layers stay on the meta device (no memory, no weights read):
    only the input embeddings, the lm_head and the final norm are read from the folder's
    safetensors, by name, in ``dtype``, on the CPU (``ends_to`` moves them). What a process
    needs that tokenizes, reads a capture's hidden states and turns the last layer's output
    into ``last_hidden`` (``final_norm``) and logits, without holding the target
    (workers/jobs/vllm_capture.py). ``capture()`` on it fails: its layers have no weights."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dtype = torch_dtype(dtype)
    folder = Path(folder)
    check_model_files(folder)
    arch, _ = read_architecture(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=False)
    wanted = {id(p) for p in (model.get_input_embeddings().weight,
                              model.get_output_embeddings().weight,
                              *final_norm(model).parameters())}
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if id(p) in wanted]
    state = _read_tensors(folder, names)
    model.load_state_dict({n: t.to(dtype) for n, t in state.items()}, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return Target(model, tokenizer, folder, arch, aux_layer_ids)


def ends_to(target: Target, device: str | torch.device) -> None:
    """Move the ends of a ``load_target_ends`` target (embeddings, lm_head, final norm) to
    ``device``; its decoder layers stay on the meta device. Tied embeddings stay tied (one
    Parameter, moved once)."""
    model = target.model
    for module in (model.get_input_embeddings(), model.get_output_embeddings(),
                   final_norm(model)):
        module.to(device)


def final_norm(model: nn.Module) -> nn.Module:
    """The norm a causal LM applies to its last layer's output (``model.model.norm`` in
    every architecture of SUPPORTED_ARCHITECTURES)."""
    norm = getattr(getattr(model, "model", None), "norm", None)
    if not isinstance(norm, nn.Module):
        raise TargetError(f"{type(model).__name__} has no final norm at model.norm")
    return norm


def _read_tensors(folder: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """The named tensors of a safetensors checkpoint (one file or an indexed set); a name
    absent from the checkpoint (a tied lm_head) is left out."""
    from safetensors import safe_open

    if (folder / WEIGHT_FILE).is_file():
        where = dict.fromkeys(names, WEIGHT_FILE)
    else:
        weight_map = json.loads((folder / WEIGHT_INDEX).read_text())["weight_map"]
        where = {n: weight_map[n] for n in names if n in weight_map}
    out: dict[str, torch.Tensor] = {}
    for file in sorted(set(where.values())):
        with safe_open(str(folder / file), framework="pt") as fh:
            keys = set(fh.keys())
            for n in names:
                if where.get(n) == file and n in keys:
                    out[n] = fh.get_tensor(n)
    return out
