"""Pair reductions behind every attention variant (the kernels floor of the house).

- :mod:`.exact`: dense and exact streaming (blocked, flash-style) log-sum-exp reductions, with
  their layouts as values (:class:`Dense`, :class:`Streaming`, :class:`DenseOrStreaming`).
- :mod:`.fast`: the NUFFT Gaussian sum, O(n + M log M) for scores in R^k, k <= 3.
- :mod:`.backends`: the strategies an attention takes as ``backend=``: :class:`Exact`,
  :class:`Fast`, :class:`Auto` (with :class:`KernelReport`, the choice and its reason).
- :mod:`.point_clouds`: ott-jax point clouds whose Sinkhorn kernel streams through :mod:`.exact`.
- :mod:`.random_partition`: the random batch method (random partitions into batches, and the
  field each token feels inside its batch).
"""

from . import backends, exact, fast, point_clouds, random_partition
from .backends import Auto, Exact, Fast, KernelReport, ScoreBox
from .exact import (
    DENSE_MAX_PAIRS,
    AbstractLayout,
    Dense,
    DenseOrStreaming,
    Streaming,
    exp_kernel_sum,
    log_weights,
    lse_average,
    sigmoid_kernel_sum,
    softmax_average,
)

__all__ = [
    "AbstractLayout",
    "Auto",
    "Dense",
    "DenseOrStreaming",
    "Exact",
    "Fast",
    "KernelReport",
    "ScoreBox",
    "backends",
    "fast",
    "DENSE_MAX_PAIRS",
    "exact",
    "point_clouds",
    "random_partition",
    "exp_kernel_sum",
    "log_weights",
    "lse_average",
    "sigmoid_kernel_sum",
    "softmax_average",
    "Streaming",
]
