"""The head registry: one ``HeadSpec`` per draft-head kind; code that depends on the kind
asks its spec (flags, names, builder) instead of comparing kind strings or head classes.

    spec = HEADS["eagle3"]          # or head_spec(head) for a head object
    spec.build(target, samples, train_config) -> a new head
    spec.start_from(head, target, train_config) -> a new head from a trained one of another kind
    spec.loss_kwargs(train_config)  -> the keyword arguments of head.loss()
    spec.uses_aux / .parallel / .block / .draft_vocab / .multi_layer / .default_mode
    spec.native_architecture / .speculators_type / .vllm_method   (checkpoint names)

Adding a kind is a head module in this folder plus one entry in ``HEADS``
(docs/adding-a-head.md). The kind strings appear only here: tests/models/heads/
test_registry.py fails on a kind literal anywhere else outside tests/.

This module imports no torch: workers and CLIs read kinds, flags and vLLM names without
loading a head; ``head_class()`` and ``build()`` import the head's module on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eaglenest.models.decode.modes import DecodeMode

if TYPE_CHECKING:
    from torch import nn

    from eaglenest.models.data.template import Sample
    from eaglenest.models.target import Target
    from eaglenest.models.training.config import TrainConfig

CHECKPOINT_FORMATS = ("native", "speculators")


def _always(config: Mapping[str, Any]) -> bool:
    return True


def _eagle3_architecture(config: Mapping[str, Any]) -> bool:
    """A native EAGLE-3 layout: vLLM's ``LlamaForCausalLMEagle3`` (or a name containing it)."""
    return any("Eagle3" in a for a in config.get("architectures") or [])


def _parallel_eagle3(config: Mapping[str, Any]) -> bool:
    """An EAGLE-3 layout with the keys vLLM's parallel-drafting proposer reads."""
    parallel = config.get("parallel_drafting") or "pard_token" in config
    return _eagle3_architecture(config) and bool(parallel or "ptd_token_id" in config)


def _dflash_layout(config: Mapping[str, Any]) -> bool:
    """A DFlash layout: vLLM's ``DFlashDraftModel`` (ours or the public checkpoints') or
    any config with a ``dflash_config`` block."""
    names = config.get("architectures") or []
    return any("DFlash" in a for a in names) or "dflash_config" in config


@dataclass(frozen=True)
class HeadSpec:
    kind: str  # EAGLENEST_HEAD / --head value, provenance "head", config.json eaglenest.head
    title: str  # the head's name in messages
    head_class_path: str  # "module:Class" of the nn.Module
    builder_path: str  # "module:function" (target, samples, TrainConfig) -> a new head
    #: head.loss() keyword -> the TrainConfig field that supplies it
    loss_settings: Mapping[str, str]
    uses_aux: bool  # fuses the target's aux hidden states (else its last hidden state)
    draft_vocab: bool  # own reduced-vocabulary lm_head + d2t/t2d; else the target's lm_head
    parallel: bool  # drafts K tokens in one forward (mask slots after the context)
    multi_layer: bool  # may stack more than one draft decoder layer
    default_mode: DecodeMode  # what an optimization job benchmarks it with
    #: vLLM's speculative-config method; also the family SUPPORTED_ARCHITECTURES lists
    vllm_method: str
    native_architecture: str  # ``architectures`` of the native config.json
    #: True for a native config.json of this kind (checked after the kinds listed later)
    native_match: Callable[[Mapping[str, Any]], bool]
    speculators_type: str | None = None  # speculators_model_type; None: native format only
    speculators_architecture: str | None = None
    job_format: str = "native"  # the checkpoint format an optimization job publishes
    #: DDP must look for parameters without gradient (a step may not use all of them)
    unused_parameters: bool = False
    #: head.loss() takes ``partition`` (sequence partitioning: models/training/partition.py)
    partitions: bool = False
    #: kinds whose trained heads a new head of this kind may start from (TrainConfig.init_head)
    starts_from: tuple[str, ...] = ()
    #: "module:function" (trained head of a kind in ``starts_from``, target, TrainConfig)
    #: -> a new head of this kind
    start_path: str | None = None
    #: drafts a whole block in one non-causal forward over the target's injected context
    #: (``context_kv`` / ``draft_block``; decoded in DecodeMode.BLOCK); cfg.block_size set
    block: bool = False
    _cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def formats(self) -> tuple[str, ...]:
        return CHECKPOINT_FORMATS if self.speculators_type else CHECKPOINT_FORMATS[:1]

    def head_class(self) -> type[nn.Module]:
        cls: type[nn.Module] = self._load(self.head_class_path)
        return cls

    def build(self, target: Target, samples: list[Sample], config: TrainConfig) -> nn.Module:
        """A new head for ``target``, initialised from it (training starts here)."""
        head: nn.Module = self._load(self.builder_path)(target, samples, config)
        return head

    def start_from(self, head: nn.Module, target: Target, config: TrainConfig) -> nn.Module:
        """A new head of this kind holding ``head``'s weights (a kind in ``starts_from``)."""
        if self.start_path is None:
            raise ValueError(f"{self.title} heads start only from {self.title} heads")
        new: nn.Module = self._load(self.start_path)(head, target, config)
        return new

    def loss_kwargs(self, config: TrainConfig) -> dict[str, Any]:
        return {arg: getattr(config, name) for arg, name in self.loss_settings.items()}

    def _load(self, path: str) -> Any:
        if path not in self._cache:
            module, _, name = path.partition(":")
            self._cache[path] = getattr(importlib.import_module(module), name)
        return self._cache[path]


_HEADS = "eaglenest.models.heads"

EAGLE = HeadSpec(
    kind="eagle", title="EAGLE-1/2",
    head_class_path=f"{_HEADS}.eagle:EagleHead", builder_path=f"{_HEADS}.eagle:build",
    loss_settings={},
    uses_aux=False, draft_vocab=False, parallel=False, multi_layer=False,
    default_mode=DecodeMode.CHAIN, vllm_method="eagle",
    native_architecture="LlamaForCausalLM", native_match=_always,
)
EAGLE3 = HeadSpec(
    kind="eagle3", title="EAGLE-3",
    head_class_path=f"{_HEADS}.eagle3:Eagle3Head", builder_path=f"{_HEADS}.eagle3:build",
    loss_settings={"steps": "ttt_steps", "decay": "step_decay"},
    uses_aux=True, draft_vocab=True, parallel=False, multi_layer=True,
    default_mode=DecodeMode.CHAIN, vllm_method="eagle3",
    native_architecture="LlamaForCausalLMEagle3", native_match=_eagle3_architecture,
    speculators_type="eagle3", speculators_architecture="Eagle3Speculator",
)
PEAGLE = HeadSpec(
    kind="peagle", title="P-EAGLE",
    head_class_path=f"{_HEADS}.peagle:PEagleHead", builder_path=f"{_HEADS}.peagle:build",
    loss_settings={"steps": "parallel_depth", "decay": "step_decay", "keep_prob": "keep_prob"},
    uses_aux=True, draft_vocab=True, parallel=True, multi_layer=True,
    default_mode=DecodeMode.PARALLEL, vllm_method="eagle3",
    native_architecture="LlamaForCausalLMEagle3", native_match=_parallel_eagle3,
    speculators_type="peagle", speculators_architecture="PEagleSpeculator",
    job_format="speculators",
    # conditional drop-token sampling can keep no slot at some depth: mask_hidden unused
    unused_parameters=True,
    partitions=True,
    # the same layers read the same aux states: an EAGLE-3 head is a trained start
    starts_from=(EAGLE3.kind,), start_path=f"{_HEADS}.peagle:from_eagle3",
)

DFLASH = HeadSpec(
    kind="dflash", title="DFlash",
    head_class_path=f"{_HEADS}.dflash:DFlashHead", builder_path=f"{_HEADS}.dflash:build",
    loss_settings={"block_size": "dflash_block_size", "gamma": "dflash_gamma",
                   "anchors": "dflash_anchors", "variable_prefix": "dflash_variable_prefix"},
    uses_aux=True, draft_vocab=True, parallel=False, multi_layer=True,
    default_mode=DecodeMode.BLOCK, vllm_method="dflash",
    native_architecture="DFlashDraftModel", native_match=_dflash_layout,
    # anchors split into parts, each a backward (models/heads/dflash_train.py)
    partitions=True,
    block=True,
)

#: every kind, in the order CLIs and messages list them
HEADS: dict[str, HeadSpec] = {s.kind: s for s in (EAGLE, EAGLE3, PEAGLE, DFLASH)}
KINDS: tuple[str, ...] = tuple(HEADS)
DEFAULT_KIND = EAGLE3.kind  # TrainConfig's default


def head_spec(head: object) -> HeadSpec:
    """The spec of a head object (its class or the nearest registered base class)."""
    spec = find_head_spec(head)
    if spec is None:
        raise TypeError(f"not a draft head: {type(head).__name__}")
    return spec


def find_head_spec(head: object) -> HeadSpec | None:
    by_class = {s.head_class(): s for s in HEADS.values()}
    for cls in type(head).__mro__:
        if cls in by_class:
            return by_class[cls]
    return None


def spec_of_config(config: Mapping[str, Any]) -> HeadSpec:
    """The kind a saved head's config.json (native or speculators) holds."""
    if "speculators_model_type" in config:
        name = config["speculators_model_type"]
        for spec in HEADS.values():
            if spec.speculators_type is not None and spec.speculators_type == name:
                return spec
        raise ValueError(f"unsupported speculators_model_type {name!r}")
    return _native_spec(config)


def _native_spec(config: Mapping[str, Any]) -> HeadSpec:
    for spec in reversed(HEADS.values()):  # a kind refining another is listed after it
        if spec.native_match(config):
            return spec
    raise ValueError(f"no head kind matches architectures {config.get('architectures')!r}")


def vllm_speculative_method(config: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's speculative-config ``method`` (and ``parallel_drafting``) for a saved head.

    A speculators type EagleNest does not train (e.g. EAGLE-1 speculators checkpoints) is
    told apart by its layout, as a native config is: vLLM loads it either way."""
    try:
        spec = spec_of_config(config)
    except ValueError:
        spec = _native_spec(config)
    extra = config.get("speculators_config") or {}
    out: dict[str, Any] = {"method": spec.vllm_method}
    if spec.parallel or config.get("parallel_drafting") or extra.get("parallel_drafting"):
        out["parallel_drafting"] = True
    return out
