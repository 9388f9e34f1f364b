"""Random Llama targets built on the device, random heads, timing helpers (the oracle drafter:
benchmarks/oracle.py)."""

from __future__ import annotations

import copy
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

START = time.perf_counter()
PAD, BOS, EOS = 0, 1, 2


def log(msg: str) -> None:
    """A progress line with the elapsed seconds and the wall clock (flushed: partial runs)."""
    stamp = time.strftime("%H:%M:%S")
    print(f"[{time.perf_counter() - START:7.1f}s {stamp}] {msg}", flush=True, file=sys.stdout)


@dataclass(frozen=True)
class Spec:
    """One target and the sizes its sections run at."""

    name: str
    config: dict[str, Any]
    seq_len: int = 512  # training samples
    samples: int = 4
    draft_vocab: int = 8192
    prompts: tuple[int, ...] = (16, 64, 200)  # lossless prompt lengths
    new_tokens: int = 64  # lossless
    context: int = 512  # verify_cost KV context
    repeats: int = 10  # verify_cost medians
    bench_prompt: int = 128  # throughput
    bench_tokens: int = 128
    bench_repeats: int = 2
    train_warmup: int = 5
    train_steps: int = 20


_LLAMA = dict(num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
              max_position_embeddings=8192, rms_norm_eps=1e-5)
SPECS: dict[str, Spec] = {
    # Llama-3.2-1B shape (tied embeddings, 1.24B parameters)
    "1b": Spec("1b", dict(_LLAMA, hidden_size=2048, num_hidden_layers=16,
                          intermediate_size=8192, tie_word_embeddings=True)),
    # Llama-3.1-8B shape (8.03B parameters)
    "8b": Spec("8b", dict(_LLAMA, hidden_size=4096, num_hidden_layers=32,
                          intermediate_size=14336, tie_word_embeddings=False)),
    # models/tiny.py's COMMON shape (seconds on a CPU)
    "tiny": Spec("tiny", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                              max_position_embeddings=512, vocab_size=512),
                 seq_len=64, draft_vocab=64, prompts=(6, 12), new_tokens=24, context=64,
                 repeats=3, bench_prompt=16, bench_tokens=32, bench_repeats=1,
                 train_warmup=2, train_steps=4),
}


def set_exact_fp32() -> None:
    """No TF32 in float32 matmuls: the fp32 lossless check compares exact greedy outputs."""
    matmul = torch.backends.cuda.matmul
    try:
        matmul.fp32_precision = "ieee"  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        matmul.allow_tf32 = False


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], device: torch.device, repeats: int,
              warmup: int = 2, after: Callable[[], object] | None = None) -> float:
    """Median wall time of ``fn`` in ms, device-synchronised; ``after`` runs untimed."""
    times = []
    for i in range(warmup + repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
        if after is not None:
            after()
    return statistics.median(times)


def random_ids(n: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def build_model(spec: Spec, device: torch.device) -> nn.Module:
    """A random LlamaForCausalLM in float32, created on ``device`` (no CPU round trip)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**spec.config, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.eval()


@dataclass
class Bench:
    """One target on the device, built lazily in float32, and the random heads built for it
    (cached per kind and dtype). Another dtype converts the model in place on CUDA (an 8B
    model has room for one copy); on a CPU it is a converted copy, so the float32 model's
    weights never change under the oneDNN copy the engine caches for it."""

    spec: Spec
    device: torch.device
    #: the run's output folder and the service's wheels (the `service` section)
    out: Path = Path("gpu_check_out")
    wheels: Path | None = None
    models: dict[torch.dtype, nn.Module] = field(default_factory=dict)
    heads: dict[tuple[str, torch.dtype], nn.Module] = field(default_factory=dict)

    def model(self, dtype: torch.dtype) -> nn.Module:
        if not self.models:
            t0 = time.perf_counter()
            self.models[torch.float32] = model = build_model(self.spec, self.device)
            n = sum(p.numel() for p in model.parameters()) / 1e9
            log(f"{self.spec.name}: built {n:.2f}B parameters in {time.perf_counter() - t0:.1f}s")
        if dtype not in self.models:
            if self.device.type == "cuda":
                (old,) = self.models.values()
                self.models = {dtype: old.to(dtype)}
            else:
                self.models[dtype] = copy.deepcopy(self.models[torch.float32]).to(dtype)
        return self.models[dtype]

    def target(self, dtype: torch.dtype) -> Any:
        """A models.target.Target over the model in ``dtype``."""
        from eaglenest.models.target import Target

        tok = SimpleNamespace(pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS)
        return Target(self.model(dtype), tok, None, "LlamaForCausalLM")

    @property
    def perf_dtype(self) -> torch.dtype:
        """Timed sections: bfloat16 on CUDA, float32 on a CPU (as models.commands loads targets;
        bf16 GEMMs are slow on most CPUs)."""
        return torch.bfloat16 if self.device.type == "cuda" else torch.float32

    def samples(self) -> list[Any]:
        """Random training samples (assistant mask on all but the first 4 tokens)."""
        from eaglenest.models.data.template import Sample

        n, vocab = self.spec.seq_len, int(self.spec.config["vocab_size"])
        return [Sample(random_ids(n, vocab, 100 + i), [0] * 4 + [1] * (n - 4))
                for i in range(self.spec.samples)]

    def head(self, kind: str, dtype: torch.dtype) -> nn.Module:
        """A random (untrained) ``kind`` head ("eagle3" / "peagle") in ``dtype``, eval mode."""
        key = (kind, dtype)
        if key not in self.heads:
            base = self.heads.get((kind, torch.float32))
            if base is None:
                from eaglenest.models.heads.registry import HEADS
                from eaglenest.models.training.config import TrainConfig

                target = self.target(next(iter(self.models), torch.float32))  # as it is
                torch.manual_seed(0)
                cfg = TrainConfig(head=kind, draft_vocab_size=self.spec.draft_vocab)
                built = HEADS[kind].build(target, self.samples(), cfg)
                base = self.heads[(kind, torch.float32)] = built.to(self.device).eval()
            if dtype != torch.float32:
                self.heads[key] = copy.deepcopy(base).to(dtype).eval()
        return self.heads[key]

    def close(self) -> None:
        self.models, self.heads = {}, {}
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
