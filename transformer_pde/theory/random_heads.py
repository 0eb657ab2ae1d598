"""Closed forms of the random Transformer (sphere.md §5)."""

from __future__ import annotations

import numpy as np


def logistic(u0, s):
    """Solution of u' = u(1 − u), u(0) = u0: u0 e^s/(1 − u0 + u0 e^s) (the overlap ODE of
    equiangular data in the diffusive clock, up to O(1/d))."""
    s = np.asarray(s, dtype=float)
    return u0 * np.exp(s) / (1 - u0 + u0 * np.exp(s))


__all__ = ["logistic"]
