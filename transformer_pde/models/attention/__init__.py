"""The attention family: every variant maps a measure μ to a velocity field Γ_μ."""

from .attention_perceptron import AttentionPerceptron
from .base import (
    AbstractAttention,
    AbstractBilinearAttention,
    AbstractGaussianClosure,
    AbstractNormalizedAttention,
)
from .l2 import L2Attention
from .sinkhorn import SinkhornAttention, SinkhornPotentials, sinkhorn_conditional_cov
from .softmax import MultiHeadAttention, SoftmaxAttention
from .unnormalized import SigmoidAttention, UnnormalizedAttention

__all__ = [
    "AbstractAttention",
    "AbstractBilinearAttention",
    "AbstractGaussianClosure",
    "AbstractNormalizedAttention",
    "AttentionPerceptron",
    "L2Attention",
    "MultiHeadAttention",
    "SigmoidAttention",
    "SinkhornAttention",
    "SinkhornPotentials",
    "SoftmaxAttention",
    "UnnormalizedAttention",
    "sinkhorn_conditional_cov",
]
