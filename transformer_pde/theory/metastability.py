r"""Closed forms of dynamic metastability on S¹ (GKPR; docs: math/sphere.md#metastability): the
overlap α of two caps and the time two point clusters take to merge; the escape rate from the
bipodal state and the slope C of its length C ln n + D (Menon–Murray; docs:
math/sphere.md#bipodal-metastability)."""

from __future__ import annotations

import numpy as np

from .._checks import check_in_range, check_real, check_scalar


def cap_alpha(eps, angle):
    """α(ε) = max ⟨x, y⟩ over the 2ε-caps of two centers ``angle`` apart (docs: math/sphere.md#metastability)."""
    check_in_range(eps, "eps", low=0.0, high=1.0, meaning="1 - 2 eps is a cosine")
    check_real(angle, "angle")
    return float(np.cos(angle - 2 * np.arccos(1 - 2 * eps)))


def predicted_exit_time(betas, angle):
    """T ≈ e^{β(1 − cos θ0)} / (2β sin² θ0) for two caps θ0 = ``angle`` apart [derived for the library].

    After the caps collapse, two point clusters of equal mass at angle θ obey
    dθ/dt = −2 e^{−β(1 − cos θ)} sin θ (SA); the time to close any fixed gap is dominated by
    the start, ∫ e^{β(1−cos θ)}/(2 sin θ) dθ ≈ e^{β(1−cos θ0)}/(2β sin²θ0) as β → ∞."""
    check_in_range(angle, "angle", low=0.0, high=np.pi, low_open=True, high_open=True,
                   meaning="two distinct, non-antipodal caps")
    b = np.asarray(check_real(betas, "betas", positive=True), dtype=float)
    return np.exp(b * (1 - np.cos(angle))) / (2 * b * np.sin(angle) ** 2)


def bipodal_gamma(a, b, phi):
    """γ(φ) = a cos²φ + b sin²φ = ⟨u, Ku⟩ for K = diag(a, b) and u = (cos φ, sin φ): the score of a
    token with its own cluster at u (docs: math/sphere.md#bipodal-metastability)."""
    a, b = float(check_scalar(a, "a")), float(check_scalar(b, "b"))
    phi = np.asarray(check_real(phi, "phi"), dtype=float)
    return a * np.cos(phi) ** 2 + b * np.sin(phi) ** 2


def bipodal_escape_rate(gamma):
    """λ = 2e^{−γ}/(e^{γ} + e^{−γ}) = 2/(e^{2γ} + 1) [derived for the library]: the one positive
    eigenvalue of SA on S¹ (β = 1, Q = V = I, K symmetric) at two antipodal point clusters of equal
    mass at ±u with γ = ⟨u, Ku⟩ (docs: math/sphere.md#bipodal-metastability).

    The unstable mode moves the clusters off antipodality: with θ₂ − θ₁ = π + δ each cluster
    feels the other through the weight e^{−γ} against the partition e^{γ}/2 + e^{−γ}/2, so
    dδ/dt = λδ. Menon–Murray state e^{−γ}: the attention normalized by n instead of Z."""
    g = np.asarray(check_real(gamma, "gamma"), dtype=float)
    return 2.0 / (np.exp(2.0 * g) + 1.0)


def bipodal_log_slope(a, b):
    """C(a, b) = 1/(2λ(γ*)) = (e^{2γ*} + 1)/4, γ* = max(a, b) [derived for the library]: the slope
    of the bipodal phase length C ln n + D for n i.i.d. uniform tokens on S¹, K = diag(a, b),
    a ≠ b (docs: math/sphere.md#bipodal-metastability).

    The clusters form along the dominant axis of K (γ = γ*), and their defect from antipodality
    starts at the size of the sampling noise, δ₀ ∝ n^{−1/2}; leaving a fixed neighbourhood
    δ = δ_exit takes ln(δ_exit/δ₀)/λ = ln(n)/(2λ) + O(1)."""
    a, b = float(check_scalar(a, "a")), float(check_scalar(b, "b"))
    if a == b:
        raise ValueError(f"bipodal_log_slope needs a ≠ b (a dominant axis of K), got a = b = {a}")
    return float(1.0 / (2.0 * bipodal_escape_rate(max(a, b))))


__all__ = ["bipodal_escape_rate", "bipodal_gamma", "bipodal_log_slope", "cap_alpha", "predicted_exit_time"]
