"""Metastability closed forms (theory.metastability) against direct computations: the cap overlap
from the caps' extreme points, the merging time from the integral it approximates."""

import numpy as np
import pytest
import scipy.integrate

from transformer_pde.theory.metastability import cap_alpha, predicted_exit_time


def test_cap_alpha_is_the_largest_inner_product_of_the_caps():
    eps, angle = 0.05, 1.2
    r = np.arccos(1 - 2 * eps)  # the angular radius of S(2ε) = {⟨x, w⟩ >= 1 − 2ε}
    a = np.linspace(-r, r, 2001)
    inner = np.cos(angle + a[:, None] - a[None, :])  # points of the two caps, centers `angle` apart
    np.testing.assert_allclose(cap_alpha(eps, angle), inner.max(), rtol=1e-12)


@pytest.mark.parametrize("angle", [np.pi / 2, 1.0])
def test_exit_time_is_the_merging_integral_to_leading_order(angle):
    """∫_{θ*}^{θ0} e^{β(1−cos θ)}/(2 sin θ) dθ (the time two clusters take to close the gap, for any
    fixed θ* < θ0) is e^{β(1−cos θ0)}/(2β sin²θ0) (1 + O(1/β))."""
    beta = np.array([100.0, 400.0])
    exact = np.array([scipy.integrate.quad(lambda t: np.exp(b * (np.cos(angle) - np.cos(t))) / (2 * np.sin(t)),
                                           angle / 2, angle, epsabs=0, epsrel=1e-12)[0] for b in beta])
    ratio = exact / (predicted_exit_time(beta, angle) * np.exp(-beta * (1 - np.cos(angle))))
    assert np.all(np.abs(ratio - 1) < 3 / beta), ratio
    assert abs(ratio[1] - 1) < abs(ratio[0] - 1)  # the error falls like 1/β
