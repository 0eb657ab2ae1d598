r"""Closed forms of dynamic metastability on S¹ (GKPR; docs: math/sphere.md#metastability): the
overlap α of two caps and the time two point clusters take to merge."""

from __future__ import annotations

import numpy as np

from .._checks import check_in_range, check_real


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


__all__ = ["cap_alpha", "predicted_exit_time"]
