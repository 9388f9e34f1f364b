"""Draft heads: EAGLE-1/2 (``EagleHead``), EAGLE-3 (``Eagle3Head``), P-EAGLE (``PEagleHead``)."""

from eaglenest.models.heads.base import HeadBatch, HeadLoss
from eaglenest.models.heads.eagle import EagleHead
from eaglenest.models.heads.eagle3 import Eagle3Head
from eaglenest.models.heads.layers import HeadConfig
from eaglenest.models.heads.peagle import PEagleHead

__all__ = ["EagleHead", "Eagle3Head", "HeadBatch", "HeadConfig", "HeadLoss", "PEagleHead"]
