"""Relative entropy to a target density and the normalization check (issue 22 item 5).

Oracles: the closed-form KL between Gaussians (a Gauss–Hermite rule integrates the quadratic
log-ratio exactly; Monte Carlo within its standard error), and densities whose mass is known.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp

D = tp.diagnostics
M0, C0 = jnp.array([0.2, -0.1]), jnp.array([[1.0, 0.3], [0.3, 0.5]])
M1, C1 = jnp.array([1.0, 0.5]), jnp.array([[2.0, -0.4], [-0.4, 1.0]])


def _logpdf(x, m, c):
    """log N(m, c) at the rows of x."""
    L = jnp.linalg.cholesky(c)
    z = jax.scipy.linalg.solve_triangular(L, (x - m[None, :]).T, lower=True)
    return -0.5 * jnp.sum(z**2, axis=0) - jnp.sum(jnp.log(jnp.diag(L))) - x.shape[1] / 2 * math.log(2 * math.pi)


def _kl_gauss(m0, c0, m1, c1):
    c1i = np.linalg.inv(c1)
    dm = np.asarray(m1 - m0)
    return 0.5 * (np.trace(c1i @ c0) + dm @ c1i @ dm - 2 + np.log(np.linalg.det(c1) / np.linalg.det(c0)))


def target(x):
    return _logpdf(x, M1, C1)


def test_relative_entropy_quadrature_and_monte_carlo_match_closed_form():
    ref = _kl_gauss(M0, C0, M1, C1)
    x, w = tp.Gaussian(M0, C0).gauss_hermite(4)
    kl = D.relative_entropy(x, _logpdf(x, M0, C0), target, weights=w)
    assert abs(float(kl) - ref) < 1e-12
    xs = tp.Gaussian(M0, C0).sample(jax.random.key(0), 4000)
    terms = _logpdf(xs, M0, C0) - target(xs)
    kl_mc = D.relative_entropy(xs, _logpdf(xs, M0, C0), target)
    assert abs(float(kl_mc) - ref) < 4 * float(jnp.std(terms)) / math.sqrt(4000)
    # under jit (the error checks become eqx.error_if)
    jitted = eqx.filter_jit(lambda x, lr, w: D.relative_entropy(x, lr, target, w))
    assert abs(float(jitted(x, _logpdf(x, M0, C0), w)) - ref) < 1e-12


def test_relative_entropy_errors():
    x = jnp.array([[1.0, 0.0], [-1.0, 0.0]])
    half = lambda x: jnp.where(x[:, 0] > 0, _logpdf(x, jnp.zeros(2), jnp.eye(2)) + math.log(2), -jnp.inf)
    with pytest.raises(ValueError, match=r"zero density .* token 1, x = \[-1.0, 0.0\].*where the flow sends mass"):
        D.relative_entropy(x, jnp.zeros(2), half)
    # a token of zero weight may sit where nu = 0
    assert np.isfinite(float(D.relative_entropy(x, jnp.zeros(2), half, weights=jnp.array([1.0, 0.0]))))
    with pytest.raises(ValueError, match="log_rho is nan at token 0"):
        D.relative_entropy(x, jnp.array([jnp.nan, 0.0]), target)
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        D.relative_entropy(x, jnp.zeros(3), target)
    with pytest.raises(Exception, match="zero density"):
        jax.block_until_ready(eqx.filter_jit(lambda x: D.relative_entropy(x, jnp.zeros(2), half))(x))


def test_check_normalized():
    assert abs(D.check_normalized(target, 2, scale=2.0) - 1) < 1e-9
    nu = 3.0

    def student(x):
        return (math.lgamma((nu + 2) / 2) - math.lgamma(nu / 2) - math.log(nu * math.pi)
                - (nu + 2) / 2 * jnp.log1p(jnp.sum(x**2, -1) / nu))

    assert abs(D.check_normalized(student, 2) - 1) < 1e-5  # tail beyond 256: ~1e-7
    with pytest.raises(ValueError, match="not normalizable"):
        D.check_normalized(lambda x: jnp.zeros(x.shape[0]), 2)
    with pytest.raises(ValueError, match="not normalizable"):
        D.check_normalized(lambda x: -jnp.log1p(jnp.sum(x**2, -1)), 2)  # ~|x|^-2 in R^2
    with pytest.raises(ValueError, match=r"mass is 2.71828, not 1"):
        D.check_normalized(lambda x: target(x) + 1.0, 2, scale=2.0)
    with pytest.raises(ValueError, match="dim 1, 2 or 3"):
        D.check_normalized(target, 4)


@pytest.mark.parametrize("x, log_rho, message", [
    (np.eye(3, 2).astype(complex), np.zeros(3), r"x must be a real floating array, got dtype complex128"),
    (np.full((3, 2), "a"), np.zeros(3), r"x must be a real floating array"),
    (np.array([[np.nan, 0.0], [0.0, 1.0], [0.6, 0.8]]), np.zeros(3), r"x must be finite, but x\[0, 0\] = nan"),
    (np.eye(3, 2), np.zeros(3, complex), r"log_rho must be a real floating array, got dtype complex128"),
    (np.eye(3, 2), np.full(3, "a"), r"log_rho must be a real floating array"),
])
def test_relative_entropy_checks_tokens_and_real_dtypes(x, log_rho, message):
    """The tokens are checked as tokens (real, finite, (n, d)) and log ρ must be real: a complex
    log ρ was summed as complex, string tokens failed inside JAX (issue 37 part 9)."""
    with pytest.raises(ValueError, match=message):
        tp.diagnostics.relative_entropy(x, log_rho, lambda z: -jnp.sum(z**2, -1))
