"""Pair reductions behind every attention variant (the kernels floor of the house).

- :mod:`.exact`: dense and exact streaming (blocked, flash-style) log-sum-exp reductions.
- :mod:`.ott`: ott-jax point clouds whose Sinkhorn kernel streams through :mod:`.exact`.
- :mod:`.random_batch`: the random batch method (interactions inside random batches).
"""

from . import exact, random_batch
from .exact import (
    DENSE_MAX_PAIRS,
    choose_path,
    exp_kernel_sum,
    lse_average,
    sigmoid_kernel_sum,
    softmax_average,
)

__all__ = [
    "DENSE_MAX_PAIRS",
    "choose_path",
    "exact",
    "random_batch",
    "exp_kernel_sum",
    "lse_average",
    "sigmoid_kernel_sum",
    "softmax_average",
]
