"""Scalar multi-head attention on equiangular starts (docs: math/sphere.md#equiangular-multi-head-attention):
the reduced ODE against the particles' velocities and trajectories, the closed-form critical β, and
the super-additive clustering rates of heterogeneous heads."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.theory import equiangular as eq


def _velocity(dynamics, x):
    """The field at x, compiled once (op by op it costs more than the test)."""
    return np.asarray(eqx.filter_jit(lambda m, y: m.velocity(y))(dynamics, x))


def _mean_rho(x):
    x = np.asarray(x)
    n = x.shape[0]
    return (np.sum(x @ x.T) - n) / (n * (n - 1))


def test_one_head_is_sa():
    ode, sa = eq.MultiHeadReducedODE(7, 2.5, [1.0], [1.0]), eq.SAReducedODE(7, jnp.asarray(2.5))
    for rho in (-1 / 6, -0.1, 0.0, 0.4, 0.99):
        np.testing.assert_allclose(ode.rho_rate(rho), sa.rho_rate(rho), rtol=1e-13)


@pytest.mark.parametrize("rho0", [pytest.param(-0.15, marks=pytest.mark.slow), 0.0, pytest.param(0.3, marks=pytest.mark.slow)])
def test_particle_velocities_give_the_reduced_rate(rho0):
    # every pair's d⟨x_i, x_j⟩/dt from the multi-head field equals the scalar ODE's rate
    n = d = 7
    scores, values = np.array([0.0, 1.5, -0.7]), np.array([-0.4, 1.0, 0.6])
    x = eq.equiangular_start(jax.random.key(1), n, d, rho0)
    v = _velocity(tp.Sphere(tp.MultiHeadAttention.scalar(d, scores, values, beta=1.7)), x)
    pair_rates = v @ np.asarray(x).T + np.asarray(x) @ v.T
    off = ~np.eye(n, dtype=bool)
    np.testing.assert_allclose(pair_rates[off], eq.MultiHeadReducedODE(n, 1.7, scores, values).rho_rate(rho0),
                               rtol=1e-10, atol=1e-13)


@pytest.mark.slow
def test_particles_follow_the_reduced_ode():
    n = d = 5
    scores, values = np.array([0.5, 3.0]), np.array([1.0, 0.7])
    ts = jnp.linspace(0.0, 2.0, 9)
    x0 = eq.equiangular_start(jax.random.key(2), n, d, 0.0)
    sol = tp.solve(tp.Sphere(tp.MultiHeadAttention.scalar(d, scores, values, beta=2.0)), x0, t1=2.0, dt0=1e-2,
                   saveat=diffrax.SaveAt(ts=ts), stepsize_controller=diffrax.PIDController(rtol=1e-10, atol=1e-12))
    gap = eq.reduced_gap(eq.MultiHeadReducedODE(n, 2.0, scores, values), 0.0, ts,
                         diffrax.PIDController(rtol=1e-10, atol=1e-14))
    np.testing.assert_allclose([_mean_rho(x) for x in sol.xs], 1 - np.asarray(gap), atol=1e-8)


@pytest.mark.parametrize("rho0", [pytest.param(-0.1, marks=pytest.mark.slow), 0.25])
def test_usa_heads_velocities_give_the_reduced_rate(rho0):
    # the paper's gradient flow: head h is USA with Q = V = m_h I, K = I; the heads' fields add
    n = d = 6
    scores = np.array([0.8, -1.3, 0.4])
    x = eq.equiangular_start(jax.random.key(5), n, d, rho0)
    eye = np.eye(d)
    v = sum(_velocity(tp.Sphere(tp.UnnormalizedAttention(m * eye, eye, m * eye, 1.4)), x) for m in scores)
    pair_rates = v @ np.asarray(x).T + np.asarray(x) @ v.T
    off = ~np.eye(n, dtype=bool)
    np.testing.assert_allclose(pair_rates[off], eq.MultiHeadUSAReducedODE(n, 1.4, scores).rho_rate(rho0),
                               rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(eq.MultiHeadUSAReducedODE(n, 1.4, [1.0]).rho_rate(rho0),
                               eq.USAReducedODE(n, jnp.asarray(1.4)).rho_rate(rho0), rtol=1e-13)


def test_usa_critical_beta_is_where_the_reduced_rate_changes_sign():
    m1, m, rho0 = 0.7, 1.2, 0.3
    bc = eq.usa_critical_beta(m1, m, rho0)
    rate = lambda b: float(eq.MultiHeadUSAReducedODE(6, b, [m1, -m]).rho_rate(rho0))  # noqa: E731
    assert abs(rate(bc)) < 1e-14
    assert rate(0.95 * bc) < 0 < rate(1.05 * bc)  # clusters above β_c


def test_critical_beta_is_where_the_reduced_rate_changes_sign():
    n, a, w, c, rho0 = 8, 1.3, 1.0, 0.6, 0.2
    bc = eq.multihead_critical_beta(n, a, w, c, rho0)
    rate = lambda b: float(eq.MultiHeadReducedODE(n, b, [a, 0.0], [w, -c]).rho_rate(rho0))  # noqa: E731
    assert abs(rate(bc)) < 1e-14
    assert rate(0.95 * bc) > 0 > rate(1.05 * bc)


@pytest.mark.slow
@pytest.mark.parametrize("side", [0.8, 1.25])
def test_particles_cluster_below_the_critical_beta_and_spread_above(side):
    # the closed form, derived by hand, decides the particles' fate on either side of it
    n = d = 6
    a, w, c, rho0 = 1.0, 1.0, 0.5, 0.0
    beta = side * eq.multihead_critical_beta(n, a, w, c, rho0)
    x0 = eq.equiangular_start(jax.random.key(3), n, d, rho0)
    sol = tp.solve(tp.Sphere(tp.MultiHeadAttention.scalar(d, [a, 0.0], [w, -c], beta=beta)), x0, t1=40.0,
                   dt0=0.05, saveat=diffrax.SaveAt(t1=True),
                   stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10))
    rho = _mean_rho(sol.xs[-1])
    if side < 1:
        assert rho > 0.999  # one cluster
    else:
        assert abs(rho - (-1 / (n - 1))) < 1e-3  # the regular simplex


def test_rates_are_super_additive_over_heterogeneous_heads():
    # 1/T of two heads together >= the sum of their rates alone (parallel-sum inequality), with
    # equality iff the heads' rates are proportional (equal scores)
    n, beta, r0, r1 = 8, 3.0, 0.0, 0.95

    def rate(scores, values):
        return 1 / eq.hitting_time(eq.MultiHeadReducedODE(n, beta, scores, values), r0, r1)

    het = rate([0.2, 2.0], [1.0, 1.0]) - rate([0.2], [1.0]) - rate([2.0], [1.0])
    hom = rate([1.0, 1.0], [1.0, 0.5]) - rate([1.0], [1.0]) - rate([1.0], [0.5])
    assert het > 1e-3
    assert abs(hom) < 1e-12


@pytest.mark.slow
def test_hitting_time_matches_the_integrated_ode():
    ode, r0, r1 = eq.MultiHeadReducedODE(6, 2.0, [0.5, 3.0], [1.0, 0.5]), 0.1, 0.9
    T = eq.hitting_time(ode, r0, r1)
    gap = eq.reduced_gap(ode, r0, jnp.array([0.0, T]), diffrax.PIDController(rtol=1e-11, atol=1e-14))
    np.testing.assert_allclose(1 - gap[-1], r1, atol=1e-9)
    assert eq.hitting_time(eq.MultiHeadReducedODE(6, 2.0, [1.0], [-1.0]), r0, r1) == np.inf


def test_bad_input():
    with pytest.raises(ValueError, match="repulsion must exceed score"):
        eq.usa_critical_beta(1.0, 0.5, 0.2)
    with pytest.raises(ValueError, match="value must exceed repulsion"):
        eq.multihead_critical_beta(4, 1.0, 0.5, 0.5)
    with pytest.raises(ValueError, match="one entry per head"):
        eq.MultiHeadReducedODE(4, 1.0, [1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="scores must be finite"):
        eq.MultiHeadReducedODE(4, 1.0, [np.nan], [1.0])
    with pytest.raises(ValueError, match="rho1"):
        eq.hitting_time(eq.SAReducedODE(4, jnp.asarray(1.0)), 0.5, 0.2)
    with pytest.raises(ValueError, match="one entry per head"):
        tp.MultiHeadAttention.scalar(3, [1.0], [1.0, 2.0])
