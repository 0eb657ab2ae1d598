"""jaxtyping aliases used across the package (shapes are documentation *and* checks)."""

from collections.abc import Callable
from typing import Union

from jaxtyping import Array, ArrayLike, Float

Points = Float[Array, "n d"]
"""Token positions, one row per token (docs: math/attention.md#conventions: tokens are rows)."""
PointsLike = Float[ArrayLike, "n d"]
"""Tokens as given by a user (NumPy or JAX), validated by :func:`transformer_pde._checks.check_points`."""
Queries = Float[Array, "m d"]
QueriesLike = Float[ArrayLike, "m d"]
Weights = Float[Array, " n"]
"""Non-negative weights summing to one: μ = Σ_j w_j δ_{x_j}."""
WeightsLike = Float[ArrayLike, " n"]
Scalar = Float[ArrayLike, ""]
Matrix = Float[Array, "a b"]
Param = Union[Float[ArrayLike, "..."], Callable]
"""A parameter: a fixed array, or a callable ``t -> array`` (e.g. :class:`PiecewiseConstant`)."""
