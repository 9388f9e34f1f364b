"""Draft heads: EAGLE-1/2 (``EagleHead``), EAGLE-3 (``Eagle3Head``), P-EAGLE (``PEagleHead``)."""

from models.heads.base import HeadBatch, HeadLoss
from models.heads.eagle import EagleHead
from models.heads.eagle3 import Eagle3Head
from models.heads.layers import HeadConfig
from models.heads.peagle import PEagleHead

__all__ = ["EagleHead", "Eagle3Head", "HeadBatch", "HeadConfig", "HeadLoss", "PEagleHead"]
