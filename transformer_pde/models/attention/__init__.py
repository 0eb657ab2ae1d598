"""The attention family: every variant maps a measure μ to a velocity field Γ_μ."""

from .attention_perceptron import AttentionPerceptron
from .base import (
    AbstractAttention,
    AbstractBilinearAttention,
    AbstractCausalAttention,
    AbstractFieldAttention,
    AbstractGaussianClosure,
    AbstractKernelAttention,
    AbstractNormalizedAttention,
)
from .l2 import CausalL2Attention, L2Attention
from .sinkhorn import SinkhornAttention, SinkhornPotentials, sinkhorn_conditional_cov
from .softmax import CausalMultiHeadAttention, CausalSoftmaxAttention, MultiHeadAttention, SoftmaxAttention
from .unnormalized import (
    CausalSigmoidAttention,
    CausalUnnormalizedAttention,
    SigmoidAttention,
    UnnormalizedAttention,
)

__all__ = [
    "AbstractAttention",
    "AbstractBilinearAttention",
    "AbstractCausalAttention",
    "AbstractFieldAttention",
    "AbstractGaussianClosure",
    "AbstractKernelAttention",
    "AbstractNormalizedAttention",
    "AttentionPerceptron",
    "CausalL2Attention",
    "CausalMultiHeadAttention",
    "CausalSigmoidAttention",
    "CausalSoftmaxAttention",
    "CausalUnnormalizedAttention",
    "L2Attention",
    "MultiHeadAttention",
    "SigmoidAttention",
    "SinkhornAttention",
    "SinkhornPotentials",
    "SoftmaxAttention",
    "UnnormalizedAttention",
    "sinkhorn_conditional_cov",
]
