"""Every dynamics: a velocity field of a weighted token measure (the models room of the house).

- :mod:`.base`: :class:`AbstractDynamics` and the capabilities :class:`AbstractRetractedDynamics`,
  :class:`AbstractManifoldDynamics`.
- :mod:`.attention`: the attention families on R^d (softmax, multi-head, ℓ², Sinkhorn, sigmoid,
  unnormalized; the causal ones their own types, ALiBi a key bias), with the capabilities
  :class:`AbstractFieldAttention` (a field at arbitrary queries), :class:`AbstractCausalAttention`,
  :class:`AbstractKernelAttention`, :class:`AbstractNormalizedAttention` and
  :class:`AbstractGaussianClosure`.
- :mod:`.sphere`: the sphere (:class:`Sphere`, projected) and the post-LN layer (:class:`PostLN`).
- :mod:`.normalization`: the normalization schemes of real Transformers (Pre-LN, Peri-LN, Mix-LN,
  nGPT, LN-scaling) as (field, retraction) pairs; :mod:`.mlp`: MLP sublayers and blocks.
- :mod:`.litm` (lost in the middle), :mod:`.perceptron`, :mod:`.random_heads`, :mod:`.mean_shift`,
  :mod:`.rescaled`: the models of single papers; :mod:`.sharding`: any attention split over devices.
"""

from . import sharding
from .attention import (
    AbstractAttention,
    AbstractBilinearAttention,
    AbstractCausalAttention,
    AbstractFieldAttention,
    AbstractGaussianClosure,
    AbstractKernelAttention,
    AbstractNormalizedAttention,
    AttentionPerceptron,
    CausalL2Attention,
    CausalMultiHeadAttention,
    CausalSigmoidAttention,
    CausalSoftmaxAttention,
    CausalUnnormalizedAttention,
    L2Attention,
    MultiHeadAttention,
    SigmoidAttention,
    SinkhornAttention,
    SinkhornPotentials,
    SoftmaxAttention,
    UnnormalizedAttention,
)
from .base import (
    AbstractCommonDiffusion,
    AbstractDynamics,
    AbstractFieldDynamics,
    AbstractManifoldDynamics,
    AbstractRetractedDynamics,
    AbstractRetraction,
)
from .litm import LitMCircle
from .mean_shift import MeanShift
from .mlp import MLP, Block, SphereBlock
from .normalization import (
    NGPT,
    AbstractNormalizationScheme,
    LNScaling,
    MixLN,
    Norm,
    PeriLN,
    PreLN,
    num_post_layers,
    polar,
    polar_velocity,
)
from .perceptron import AbstractActivation, AbstractPotentialActivation, PerceptronBlock, ReLU, Softplus
from .random_batch import RandomBatch
from .random_heads import CommonNoiseSDE, GaussianHeads, RandomHeadsField, RandomHeadsMeanField
from .rescaled import RescaledSoftmax
from .sharding import Sharded
from .sphere import PostLN, Sphere, UnitSphere, cap_sample, normalize, tangent_projection, uniform_sphere
from .switched import AbstractSwitched, Switched

__all__ = [
    "AbstractCommonDiffusion",
    "AbstractActivation",
    "AbstractKernelAttention",
    "AbstractAttention",
    "AbstractBilinearAttention",
    "AbstractCausalAttention",
    "AbstractDynamics",
    "AbstractFieldDynamics",
    "AbstractFieldAttention",
    "AbstractGaussianClosure",
    "AbstractManifoldDynamics",
    "AbstractNormalizationScheme",
    "AbstractNormalizedAttention",
    "AbstractPotentialActivation",
    "AbstractRetractedDynamics",
    "AbstractRetraction",
    "AbstractSwitched",
    "AttentionPerceptron",
    "Block",
    "CausalL2Attention",
    "CausalMultiHeadAttention",
    "CausalSigmoidAttention",
    "CausalSoftmaxAttention",
    "CausalUnnormalizedAttention",
    "CommonNoiseSDE",
    "GaussianHeads",
    "L2Attention",
    "LNScaling",
    "LitMCircle",
    "MLP",
    "MeanShift",
    "MixLN",
    "MultiHeadAttention",
    "NGPT",
    "Norm",
    "PerceptronBlock",
    "PeriLN",
    "PostLN",
    "PreLN",
    "RandomBatch",
    "RandomHeadsField",
    "RandomHeadsMeanField",
    "ReLU",
    "RescaledSoftmax",
    "Sharded",
    "SigmoidAttention",
    "SinkhornAttention",
    "SinkhornPotentials",
    "SoftmaxAttention",
    "Softplus",
    "Sphere",
    "SphereBlock",
    "Switched",
    "UnitSphere",
    "UnnormalizedAttention",
    "cap_sample",
    "normalize",
    "num_post_layers",
    "polar",
    "polar_velocity",
    "sharding",
    "tangent_projection",
    "uniform_sphere",
]
