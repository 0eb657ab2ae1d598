"""The attention family: every variant maps a measure μ to a velocity field Γ_μ."""

from .base import AbstractAttention
from .l2 import L2Attention
from .sinkhorn import SinkhornAttention, SinkhornPotentials
from .softmax import MultiHeadAttention, SoftmaxAttention
from .unnormalized import SigmoidAttention, UnnormalizedAttention

__all__ = [
    "AbstractAttention",
    "L2Attention",
    "MultiHeadAttention",
    "SigmoidAttention",
    "SinkhornAttention",
    "SinkhornPotentials",
    "SoftmaxAttention",
    "UnnormalizedAttention",
]
