"""Pair reductions behind every attention variant (the kernels floor of the house).

- :mod:`.exact`: dense and exact streaming (blocked, flash-style) log-sum-exp reductions.
"""

from . import exact
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
    "exp_kernel_sum",
    "lse_average",
    "sigmoid_kernel_sum",
    "softmax_average",
]
