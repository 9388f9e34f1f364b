"""Optimizers and the learning-rate schedule for ``models.training.train``.

AdamW alone (the default), or Muon for the draft layer's weight matrices plus AdamW for
everything else (norms, vocabulary matrices, ``mask_hidden``), stepped together through
``Optimizers`` so training and resume treat them as one. The schedule is linear warm-up
then cosine decay to ``min_lr_ratio`` over ``max_steps`` or the time budget, whichever ends
first, the same factor for every optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from eaglenest.models.training.config import TrainConfig

__all__ = ["NS_DTYPES", "OPTIMIZERS", "BudgetShare", "Muon", "Optimizers", "lr_lambda",
           "make_optimizer", "ns_dtype", "orthogonalize"]


class BudgetShare:
    """The share of ``TrainConfig.max_seconds`` spent, as the ranks agreed it before the
    current step (models.training.train sets ``used``; the LR schedule reads it)."""

    def __init__(self) -> None:
        self.used = 0.0

    def __call__(self) -> float:
        return self.used


def lr_lambda(config: TrainConfig,
              budget_used: Callable[[], float] | None = None) -> Callable[[int], float]:
    """Linear warmup to 1, then cosine decay to min_lr_ratio at max_steps, or sooner: with
    ``budget_used`` (the share of ``max_seconds`` spent, the same on every rank) the decay
    follows whichever is further along, so a run stopped by its time budget ends at the
    floor. Example (warmup 10, max_steps 100000, half the budget spent at step 500): the
    steps say 0.5%, the clock 50%, so the factor is the cosine's at 50%."""

    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        span = max(config.max_steps - config.warmup_steps, 1)
        progress = min((step - config.warmup_steps) / span, 1.0)
        if budget_used is not None:
            progress = max(progress, min(budget_used(), 1.0))
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine

    return factor


def make_optimizer(head: nn.Module, config: TrainConfig,
                   budget_used: Callable[[], float] | None = None) -> tuple[Any, Any]:
    """(optimizer, scheduler): AdamW, or Muon + AdamW stepped together (``Optimizers``);
    ``budget_used``: see ``lr_lambda``."""
    if config.optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {config.optimizer!r}; one of {OPTIMIZERS}")
    named = [(n, p) for n, p in head.named_parameters() if p.requires_grad]
    factor = lr_lambda(config, budget_used)
    if config.optimizer == "adamw":
        opt = torch.optim.AdamW([p for _, p in named], lr=config.lr,
                                weight_decay=config.weight_decay)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)
    muon = [p for n, p in named if _muon_param(n, p)]
    rest = [p for n, p in named if not _muon_param(n, p)]
    device = muon[0].device if muon else torch.device("cpu")
    opts = [
        Muon(muon, lr=config.muon_lr or config.lr, weight_decay=config.muon_weight_decay,
             ns_dtype=ns_dtype(config.muon_ns_dtype, device)),
        torch.optim.AdamW(rest, lr=config.lr, weight_decay=config.weight_decay),
    ]
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, factor) for o in opts]
    return Optimizers(opts), Optimizers(scheds)


OPTIMIZERS = ("adamw", "muon")
_NOT_MUON = ("embed_tokens", "lm_head")  # vocabulary matrices stay with AdamW (Muon practice)


def _muon_param(name: str, param: torch.Tensor) -> bool:
    """Muon orthogonalises real matrices: 2-D, both sides > 1, not a vocabulary matrix."""
    return param.ndim == 2 and min(param.shape) > 1 and not any(h in name for h in _NOT_MUON)


# Quintic Newton-Schulz coefficients (Keller Jordan's Muon): steepest slope at zero, so five
# iterations push every singular value into roughly [0.7, 1.2] (not exactly 1: faster).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


NS_DTYPES = ("auto", "float32", "bfloat16")


def ns_dtype(setting: str, device: torch.device) -> torch.dtype:
    """The dtype of Muon's Newton-Schulz matmuls: ``setting`` or, for "auto", bf16 on CUDA and
    on CPUs with bf16 dot-product units (AVX512-BF16 or AMX), fp32 on other CPUs: a CPU
    without those units emulates bf16 matmuls, slower than fp32 (torch.optim.Muon always
    uses bf16).
    """
    if setting not in NS_DTYPES:
        raise ValueError(f"muon_ns_dtype must be one of {NS_DTYPES}, got {setting!r}")
    if setting != "auto":
        return getattr(torch, setting)
    if device.type == "cuda" or _cpu_has_bf16_units():
        return torch.bfloat16
    return torch.float32


def _cpu_has_bf16_units() -> bool:
    cpu = getattr(torch, "cpu", None)  # private probes; absent on some builds: assume none
    probes = [getattr(cpu, n, None) for n in ("_is_avx512_bf16_supported",
                                              "_is_amx_tile_supported")]
    return any(bool(p()) for p in probes if callable(p))


def orthogonalize(g: torch.Tensor, steps: int = 5, eps: float = 1e-7,
                  dtype: torch.dtype | None = None) -> torch.Tensor:
    """[rows, cols] -> approximately U V^T of g's SVD, by Newton-Schulz iteration.

    The iteration runs in ``dtype`` (default: bf16 on CUDA, g's own dtype elsewhere; Muon
    passes ``ns_dtype``) and returns g's dtype. Worked example: g = diag(3, 0.5) -> about
    diag(0.71, 1.04): the direction is kept, the scale of each singular value is not.
    """
    a, b, c = NS_COEFFICIENTS
    if dtype is None:
        dtype = torch.bfloat16 if g.is_cuda else g.dtype
    x = g.to(dtype, copy=True)
    tall = x.shape[0] > x.shape[1]
    if tall:  # iterate on the wide orientation: the Gram matrix is the smaller side
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if tall else x).to(g.dtype)


class Muon(torch.optim.Optimizer):
    """Momentum + orthogonalised updates for 2-D weights (MomentUm Orthogonalized by NS).

    Per step: buf = m * buf + (1 - m) * grad; update = orthogonalize(nesterov ? lerp(grad,
    buf, m) : buf); p *= 1 - lr * weight_decay; p -= lr * 0.2 * sqrt(max(rows, cols)) *
    update. The 0.2 * sqrt(max side) factor gives the update AdamW's typical RMS, so the same
    learning rate suits both optimizers.
    """

    def __init__(self, params: Any, lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                 ns_dtype: torch.dtype | None = None) -> None:
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                        nesterov=nesterov, ns_steps=ns_steps)
        super().__init__(params, defaults)
        self.ns_dtype = ns_dtype  # None: orthogonalize's default (bf16 on CUDA, else fp32)

    @torch.no_grad()
    # torch's stub overloads step() on the closure's presence; this one takes none
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            lr, m = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.ndim != 2:
                    raise ValueError("Muon updates 2-D weight matrices only")
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - m)
                update = p.grad.lerp(buf, m) if group["nesterov"] else buf
                update = orthogonalize(update, group["ns_steps"], dtype=self.ns_dtype)
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update, alpha=-lr * 0.2 * max(p.shape) ** 0.5)


class Optimizers:
    """Optimizers (or schedulers) used as one: step, zero_grad, state_dict, load_state_dict.

    ``get_last_lr`` is the last member's (AdamW's) learning rates.
    """

    def __init__(self, members: list[Any]) -> None:
        self.members = members

    def step(self) -> None:
        for m in self.members:
            m.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for m in self.members:
            m.zero_grad(set_to_none=set_to_none)

    def get_last_lr(self) -> list[float]:
        return list(self.members[-1].get_last_lr())

    def state_dict(self) -> dict[str, Any]:
        return {"members": [m.state_dict() for m in self.members]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state.get("members", [])) != len(self.members):
            raise ValueError("checkpoint was written with a different optimizer setting")
        for m, s in zip(self.members, state["members"], strict=True):
            m.load_state_dict(s)
