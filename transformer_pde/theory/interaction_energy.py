r"""Closed forms of the interaction energy E(μ) = (1/2β) ∬ e^{β⟨x, Dy⟩} dμ dμ on the sphere and
its extremizers (docs: math/sphere.md#gradient-flows-of-the-interaction-energy): the candidate
extremal measures, the regular n-gon, and the four-particle stationary state."""

from __future__ import annotations

import numpy as np

from .._checks import check_count, check_real, check_scalar


def candidate_energies(D, beta) -> dict:
    """E of the candidate extremizers (uniform weights): Dirac at the top eigenvector
    e^{βλ_max}/2β, antipodal pair on the bottom eigenvector (e^{βλ_min}+e^{−βλ_min})/4β."""
    check_real(D, "D")
    if np.ndim(D) != 2 or np.shape(D)[0] != np.shape(D)[1]:
        raise ValueError(f"D must be a square matrix, got shape {np.shape(D)}")
    check_scalar(beta, "beta", positive=True)
    lam = np.linalg.eigvalsh(np.asarray(D))
    return {"dirac_top": np.exp(beta * lam[-1]) / (2 * beta),
            "pair_bottom": np.cosh(beta * lam[0]) / (2 * beta)}


def ngon_energy(n: int, beta) -> float:
    """E of the regular n-gon on S^1 with D = I: (1/2βn) Σ_k e^{β cos(2πk/n)}."""
    n = check_count(n, "n", minimum=1)
    check_scalar(beta, "beta", positive=True)
    k = np.arange(n)
    return float(np.mean(np.exp(beta * np.cos(2 * np.pi * k / n))) / (2 * beta))


def four_particle_root(d1, d2, beta, tol=1e-14) -> float:
    """x₁² of the four-particle stationary state (±x₁, ±x₂) for D = diag(d₁, d₂): the root of
    d₁ tanh(βd₁x₁²) = d₂ tanh(βd₂(1 − x₁²)) (increasing in x₁²: bisection to ``tol``); d₁, d₂, β, tol > 0."""
    for name, value in (("d1", d1), ("d2", d2), ("beta", beta), ("tol", tol)):
        check_scalar(value, name, positive=True)  # tol > 0 ends the bisection
    f = lambda s: d1 * np.tanh(beta * d1 * s) - d2 * np.tanh(beta * d2 * (1 - s))  # noqa: E731
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


__all__ = ["candidate_energies", "four_particle_root", "ngon_energy"]
