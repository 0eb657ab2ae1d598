"""Attention with an affine feed-forward (tp.AffineFeedForward) and the moment ODEs in factor
form (tp.GaussianFactorFlow), against quadrature particles, the Gaussian state and autodiff;
the rank bound (tp.theory.gaussian.low_rank_distance) against couplings and a direct search; the
Bures–Wasserstein distance near zero against a closed form."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.theory import gaussian as G

M0 = np.array([0.3, -0.5])
S0 = np.array([[0.8, 0.2], [0.2, 0.5]])


def _model(L=2, d=2, seed=0, scale=0.4):
    """Softmax + affine feed-forward with L piecewise-constant layers on [0, 1]."""
    rng = np.random.default_rng(seed)
    pc = lambda shape: tp.PiecewiseConstant(jnp.asarray(scale * rng.normal(size=(L, *shape))), 0.0, 1.0 / L)  # noqa: E731
    attn = tp.SoftmaxAttention(pc((d, d)), pc((d, d)), pc((d, d)), 1.0)
    return tp.AffineFeedForward(attn, pc((d, d)), pc((d,)))


def _moments(x, w):
    x, w = np.asarray(x), np.asarray(w)
    m = w @ x
    return m, (x - m).T @ ((x - m) * w[:, None])


def _tsit5(L):
    return dict(t1=1.0, dt0=1.0 / (8 * L), solver=diffrax.Tsit5())


def test_field_of_a_gaussian_is_the_affine_field():
    """Γ_μ(q) + Wq + b on a 30² Gauss–Hermite rule of N(M0, S0) equals (J + W)q + c + b."""
    model = _model(L=1)
    x, w = tp.Gaussian(M0, S0).gauss_hermite(30)
    q = jnp.array([[0.1, 0.2], [-1.0, 0.5], [2.0, -1.5]])
    J, c = model.affine_field(jnp.asarray(M0), jnp.asarray(S0), 0.3)
    np.testing.assert_allclose(model.query_field(q, x, w, 0.3), q @ J.T + c[None, :], atol=1e-10)


def test_divergence_is_the_trace_of_the_jacobian():
    model = _model(L=1)
    x = jax.random.normal(jax.random.key(1), (7, 2))
    w = jnp.full(7, 1 / 7)
    q = x[:3]
    jac = jax.vmap(jax.jacfwd(lambda z: model.query_field(z[None], x, w, 0.2)[0]))(q)
    np.testing.assert_allclose(model.divergence(q, x, w, 0.2), jnp.trace(jac, axis1=1, axis2=2), atol=1e-12)


def test_closure_against_gauss_hermite_particles_through_layers():
    """The moments of 12² weighted Gauss–Hermite particles pushed by tp.solve follow the closure
    through two layers of different controls (quadrature accuracy)."""
    model = _model(L=2)
    g = tp.solve(model, tp.Gaussian(M0, S0), **_tsit5(2))
    x, w = tp.Gaussian(M0, S0).gauss_hermite(12)
    xs = tp.solve(model, tp.Particles(x, w), **_tsit5(2)).xs[-1]
    m, S = _moments(xs, w)
    np.testing.assert_allclose(m, g.final_mean, atol=1e-8)
    np.testing.assert_allclose(S, g.final_cov, atol=1e-8)
    assert np.linalg.norm(g.final_cov - S0) > 0.1  # the controls moved it


def test_factor_flow_of_full_rank_is_the_gaussian_flow():
    model = _model(L=2)
    F = np.linalg.cholesky(S0)
    x = tp.solve(tp.GaussianFactorFlow(model), np.vstack([M0, F.T]), **_tsit5(2)).xs[-1]
    g = tp.solve(model, tp.Gaussian(M0, S0), **_tsit5(2))
    np.testing.assert_allclose(x[0], g.final_mean, atol=1e-12)
    np.testing.assert_allclose(x[1:].T @ x[1:], g.final_cov, atol=1e-12)


def test_factor_flow_of_a_degenerate_gaussian_against_particles():
    """A rank-one N(m, ffᵀ) in d = 2 (tp.Gaussian refuses it): weighted particles on the line
    m + f z at 1-D Gauss–Hermite nodes z follow the factor flow's moments; the rank stays one."""
    model = _model(L=2, seed=3)
    f = np.array([0.9, 0.4])
    out = tp.solve(tp.GaussianFactorFlow(model), np.vstack([M0, f]), **_tsit5(2)).xs[-1]
    z, wz = np.polynomial.hermite_e.hermegauss(30)
    wz = wz / wz.sum()
    xs = tp.solve(model, tp.Particles(M0[None, :] + z[:, None] * f[None, :], wz), **_tsit5(2)).xs[-1]
    m, S = _moments(xs, wz)
    np.testing.assert_allclose(m, out[0], atol=1e-9)
    np.testing.assert_allclose(S, np.outer(out[1], out[1]), atol=1e-9)
    assert np.linalg.eigvalsh(S)[0] < 1e-12 * np.linalg.eigvalsh(S)[1]
    assert np.linalg.norm(out[1] - f) > 0.1


def test_refusals_name_the_bad_argument():
    attn = tp.SoftmaxAttention.identity(2, 1.0)
    with pytest.raises(ValueError, match="Gaussian closure.*SigmoidAttention"):
        tp.AffineFeedForward(tp.SigmoidAttention.identity(2, 1.0), np.eye(2), np.zeros(2))
    with pytest.raises(ValueError, match=r"AffineFeedForward.W must have shape \(d, d\) with d = 2"):
        tp.AffineFeedForward(attn, np.eye(3), np.zeros(3))
    with pytest.raises(ValueError, match=r"AffineFeedForward.b must have shape \(2,\)"):
        tp.AffineFeedForward(attn, np.eye(2), np.zeros(3))
    with pytest.raises(ValueError, match="GaussianFactorFlow.closure"):
        tp.GaussianFactorFlow(tp.MLP(np.eye(2), np.zeros(2), np.eye(2), np.zeros(2)))
    with pytest.raises(ValueError, match="at least one factor column"):
        tp.solve(tp.GaussianFactorFlow(attn), np.zeros((1, 2)), t1=0.1, dt0=0.1)


def test_low_rank_distance_is_the_minimum_over_rank_r_gaussians():
    """The bound is attained by the projection on the top r axes (a rank-r Gaussian) and no
    random rank-r Gaussian comes closer."""
    rng = np.random.default_rng(0)
    B = rng.normal(size=(3, 3))
    St, mt = B @ B.T + 0.1 * np.eye(3), rng.normal(size=3)
    lam, U = np.linalg.eigh(St)
    for r in (1, 2):
        bound = float(G.low_rank_distance(St, r))
        np.testing.assert_allclose(bound, np.sqrt(lam[: 3 - r].sum()), rtol=1e-14)
        P = U[:, 3 - r:] @ U[:, 3 - r:].T
        np.testing.assert_allclose(tp.diagnostics.bures_wasserstein(mt, P @ St @ P, mt, St), bound, rtol=1e-12)
        for _ in range(200):
            F = rng.normal(size=(3, r))
            assert float(tp.diagnostics.bures_wasserstein(mt + 0.1 * rng.normal(size=3), F @ F.T, mt, St)) >= bound
    assert float(G.low_rank_distance(St, 3)) == 0.0
    assert float(G.low_rank_distance(np.diag([2.0, 0.0, 0.0]), 1)) == 0.0
    with pytest.raises(ValueError, match="rank must be <= 3"):
        G.low_rank_distance(St, 4)
    with pytest.raises(ValueError, match="cov must be a square"):
        G.low_rank_distance(np.ones(3), 1)


def test_bures_wasserstein_resolves_distances_far_below_the_trace_formula_rounding():
    """Commuting covariances a and b = a(1 + δ), rotated: W₂² = Σ((a − b)/(√a + √b))² (no
    cancellation). With δ = 1e-10 (W₂ ~ 1e-10) the trace formula's rounding, eps·tr Σ in W₂²,
    would be ~1e-8 in W₂; the distance is right to 1e-14 (eps·|Σ|^{1/2})."""
    rng = np.random.default_rng(2)
    R, _ = np.linalg.qr(rng.normal(size=(4, 4)))
    a = np.array([0.3, 1.0, 2.5, 7.0])
    for delta in (1e-10, 1e-6, 1e-1):
        b = a * (1 + delta)
        expect = np.sqrt(np.sum(((a - b) / (np.sqrt(a) + np.sqrt(b))) ** 2))
        got = tp.diagnostics.bures_wasserstein(np.zeros(4), R @ np.diag(a) @ R.T, np.zeros(4), R @ np.diag(b) @ R.T)
        np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-14)
    S = R @ np.diag(a) @ R.T
    assert float(tp.diagnostics.bures_wasserstein(np.zeros(4), S, np.zeros(4), S)) < 1e-13
