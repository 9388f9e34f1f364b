"""Target and head linears through oneDNN with pre-packed weights (CPU, float32).

At decode shapes (one to a few dozen rows against a wide weight) PyTorch's default CPU
float32 GEMM is slower than oneDNN's with a pre-packed weight (``python -m
benchmarks.linears`` compares the two on a target).

``onednn_copy(model)`` returns a copy of the module tree that shares every parameter with
``model`` except the linears it repacks, so the original keeps its own numerics (a
baseline can still run on it) and the copy costs one extra copy of the linear weights;
``repack_linears(model)`` repacks in place (the embedded server: no second copy).
Both give the original's outputs up to float32 rounding (tests/models/decode/test_onednn.py
holds the logits to it).
"""

from __future__ import annotations

import copy
import weakref

import torch
from torch import nn


class OneDNNLinear(nn.Module):
    """``nn.Linear`` inference through oneDNN with the weight reordered once into the
    blocked layout its GEMM wants (``mkldnn._reorder_linear_weight``, the packing
    TorchInductor uses on CPU); dense input and output, no per-call layout conversion.

    ``compute_dtype`` (default: the weight's) packs the weight in that dtype and runs the
    GEMM in it, casting the input in and the output back (bfloat16: lossy)."""

    PACK_ROWS = 64  # batch-size hint for the packing (any row count stays correct)

    def __init__(self, linear: nn.Linear, compute_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.compute_dtype = compute_dtype or linear.weight.dtype
        weight = linear.weight.detach().to(self.compute_dtype)  # [out, in]
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, self.PACK_ROWS)
        bias = None if linear.bias is None else linear.bias.detach()
        self.bias = None if bias is None else bias.to(self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if x.dtype == self.compute_dtype:  # the kernel takes any leading axes itself
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        rows = x.reshape(-1, self.in_features).to(self.compute_dtype)  # [rows, in]
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)


def packing_available(weight: torch.Tensor) -> bool:
    """True where the repacking applies to this weight: float32 on CPU, oneDNN built in."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def onednn_available(model: nn.Module) -> bool:
    """True where the repacking applies to ``model`` (its first parameter decides)."""
    return packing_available(next(model.parameters()))


_COPIES: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()


def onednn_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose ``nn.Linear`` layers run through oneDNN; every other
    parameter and buffer is shared with ``model`` (not copied). One copy per model object
    (engines built on the same model share it); the weights are packed once, so a model
    whose weights change afterwards needs a new object. A model already repacked (by
    ``repack_linears``) is returned as it is."""
    if is_repacked(model):
        return model
    fast = _COPIES.get(model)
    if fast is None:
        memo: dict[int, object] = {id(t): t for t in model.parameters()}
        memo.update({id(t): t for t in model.buffers()})
        fast = _COPIES[model] = repack_linears(copy.deepcopy(model, memo))
    return fast


def repack_linears(model: nn.Module) -> nn.Module:
    """Replace ``model``'s ``nn.Linear`` layers by ``OneDNNLinear`` in place (no second
    copy of the weights: for a process that only serves the model) and return it."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, OneDNNLinear(child))
    return model


def is_repacked(model: nn.Module) -> bool:
    return any(isinstance(m, OneDNNLinear) for m in model.modules())
