r"""Causal clustering: the Rényi-parking count of the metastable centers of causal attention on the
sphere (docs: math/causal.md#metastability-and-renyi-parking), the reference of the
``causal-clustering`` experiment."""

from __future__ import annotations

import jax
import numpy as np

from .._checks import check_count, check_int, check_scalar

__all__ = ["cap_measure", "expected_renyi_centers"]


def cap_measure(delta, d: int):
    r"""σ(B_δ): normalized surface measure of a geodesic ball of radius δ on S^{d-1}.

    δ/π on S^1, (1 − cos δ)/2 on S^2; in general the regularized incomplete beta function
    I_{sin²δ}((d−1)/2, 1/2)/2 for δ <= π/2.
    """
    check_int(d, "d", minimum=2)
    delta = float(check_scalar(delta, "delta", nonnegative=True))
    if d == 2:
        return min(delta / np.pi, 1.0)
    if d == 3:
        return (1 - np.cos(min(delta, np.pi))) / 2
    half = float(jax.scipy.special.betainc((d - 1) / 2, 0.5, np.sin(min(delta, np.pi / 2)) ** 2)) / 2
    return half if delta <= np.pi / 2 else 1 - cap_measure(np.pi - delta, d)


def expected_renyi_centers(n: int, d: int, delta) -> float:
    r"""E #strong centers (:func:`transformer_pde.diagnostics.renyi_centers`) among n i.i.d. uniform
    tokens: Σ_{s=1}^n (1−p)^{s−1} = (1 − (1−p)^n)/p,
    p = σ(B_δ) (→ 1/σ(B_δ) as n → ∞; Θ(β^{(d−1)/2}) at δ = cβ^{−1/2})."""
    n = check_count(n, "n", minimum=1)
    p = cap_measure(delta, d)
    return float(n) if p == 0 else float((1 - (1 - p) ** n) / p)
