"""Draft heads: EAGLE-1/2 (``EagleHead``), EAGLE-3 (``Eagle3Head``), P-EAGLE (``PEagleHead``),
DFlash (``DFlashHead``).

``registry`` describes every kind (``HEADS``); it imports no torch, so the head classes
below are imported on first use (``from eaglenest.models.heads import EagleHead`` works).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eaglenest.models.heads.base import HeadBatch, HeadLoss
    from eaglenest.models.heads.dflash import DFlashHead
    from eaglenest.models.heads.eagle import EagleHead
    from eaglenest.models.heads.eagle3 import Eagle3Head
    from eaglenest.models.heads.layers import HeadConfig
    from eaglenest.models.heads.peagle import PEagleHead

_LAZY = {  # name -> the module that defines it
    "DFlashHead": "eaglenest.models.heads.dflash",
    "EagleHead": "eaglenest.models.heads.eagle",
    "Eagle3Head": "eaglenest.models.heads.eagle3",
    "HeadBatch": "eaglenest.models.heads.base",
    "HeadConfig": "eaglenest.models.heads.layers",
    "HeadLoss": "eaglenest.models.heads.base",
    "PEagleHead": "eaglenest.models.heads.peagle",
}
__all__ = ["DFlashHead", "EagleHead", "Eagle3Head", "HeadBatch", "HeadConfig", "HeadLoss",
           "PEagleHead"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
