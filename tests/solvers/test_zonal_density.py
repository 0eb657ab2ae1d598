"""The zonal Fokker–Planck solver on S^{d−1} (sphere.md §14): basis and Funk–Hecke against closed
forms, growth rates against tp.theory.noisy_sphere, the heat kernel, mass, d = 2 against the
circle solver, the resolution check, bad input."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.solvers import zonal
from transformer_pde.theory.noisy_sphere import NoisySA, NoisyUSA, funk_hecke

TIGHT = diffrax.PIDController(rtol=1e-11, atol=1e-13)


def dyn(model, d, beta, K=1.0):
    e = jnp.eye(d)
    return tp.Sphere(model(e, e, K * e, beta))


@pytest.mark.parametrize("d", [2, 3, 4, 8])
def test_basis_is_orthonormal_and_funk_hecke_matches_bessel(d):
    # orthonormal under an independent rule (scipy's Gauss–Jacobi), e^{-a}c_l(a) by quadrature = Bessel form
    from scipy.special import roots_jacobi

    alpha = (d - 3) / 2
    u, w = roots_jacobi(30, alpha, alpha)
    phi = zonal.basis(u, 12, d)
    np.testing.assert_allclose(phi.T @ (w[:, None] * phi) / w.sum(), np.eye(13), atol=1e-12)
    if d == 3:  # Legendre: φ_l = √(2l+1) P_l
        from scipy.special import eval_legendre

        np.testing.assert_allclose(phi[:, 5], np.sqrt(11) * eval_legendre(5, u), atol=1e-12)
    for beta in (0.5, 3.0, 9.0):
        c = np.asarray(zonal.funk_hecke_scaled(jnp.asarray(beta), 12, d)) * np.exp(beta)
        # small c_l are sums of O(c_0) terms: round-off relative to c_0
        np.testing.assert_allclose(c, funk_hecke(np.arange(13), beta, d), rtol=1e-12, atol=1e-13 * c[0])


@pytest.mark.parametrize("d", [3, 4, 8])
@pytest.mark.parametrize("model,theory", [(tp.UnnormalizedAttention, NoisyUSA), (tp.SoftmaxAttention, NoisySA)],
                         ids=["USA", "SA"])
def test_linearization_at_uniform_is_the_theory(d, model, theory):
    # the Jacobian of the right-hand side at ρ = 1 is diagonal with λ_l = l(l+d−2)(K g_l − σ²/2)
    beta, K, sigma = 2.5, 1.3, 0.8
    st = tp.ZonalDensity(np.ones(13), d, sigma)
    J = np.asarray(jax.jacfwd(lambda a: st.vector_field(dyn(model, d, beta, K), 0.0, a))(st.coeffs))
    lam = theory(beta=beta, d=d, sigma=sigma).growth_rate(np.arange(1, 13), K)
    np.testing.assert_allclose(np.diag(J)[1:], lam, rtol=1e-10, atol=1e-10)
    assert np.max(np.abs(J - np.diag(np.diag(J)))) < 1e-10


def test_growth_rates_in_time_d3():
    # ρ0 = 1 + εφ_l: the solve's measured rates against the formula (USA, d = 3, l = 1..4)
    beta, K, sigma, eps, (t1, t2) = 3.0, 2.0, 1.0, 1e-6, (0.1, 0.3)
    th = NoisyUSA(beta=beta, d=3, sigma=sigma)
    for l in range(1, 5):
        a0 = np.zeros(9)
        a0[0], a0[l] = 1.0, eps
        st = tp.ZonalDensity.from_coefficients(a0, 3, sigma)
        sol = tp.solve(dyn(tp.UnnormalizedAttention, 3, beta, K), st, t1=t2, saveat=jnp.array([t1, t2]),
                       stepsize_controller=TIGHT)
        a = np.asarray(sol.xs)[:, l]
        assert np.log(a[1] / a[0]) / (t2 - t1) == pytest.approx(th.growth_rate(l, K), rel=1e-4, abs=1e-6), l


def test_heat_kernel_and_mass():
    # V = 0: a_l decays as e^{−σ² l(l+d−2) t/2}; with attention the mass a_0 stays 1 to round-off
    d, sigma = 4, 0.9
    st = tp.ZonalDensity(lambda u: np.exp(1.5 * u), d, sigma, degree=16)
    sol = tp.solve(dyn(tp.UnnormalizedAttention, d, 1.0, 0.0), st, t1=1.0, saveat=jnp.array([1.0]),
                   stepsize_controller=TIGHT)
    lam = -sigma**2 / 2 * np.arange(17) * (np.arange(17) + d - 2)
    np.testing.assert_allclose(np.asarray(sol.xs[0]), np.asarray(st.coeffs) * np.exp(lam), rtol=1e-8, atol=1e-12)
    for model in (tp.UnnormalizedAttention, tp.SoftmaxAttention):
        sol = tp.solve(dyn(model, d, 2.0, 1.5), st, t1=1.0, saveat=jnp.array([0.5, 1.0]))
        assert abs(float(sol.xs[-1, 1]) - float(st.coeffs[1])) > 0.1  # it moved
        np.testing.assert_allclose(np.asarray(sol.xs[:, 0]), 1.0, atol=1e-13)


@pytest.mark.parametrize("model", [tp.UnnormalizedAttention, pytest.param(tp.SoftmaxAttention, marks=pytest.mark.slow)],
                         ids=["USA", "SA"])
def test_d2_agrees_with_the_circle_solver(model):
    # an even density on S¹ is zonal: ρ(θ) = f(cos θ); the two solvers agree at t = 1
    f = lambda u: np.exp(1.2 * u + 0.5 * u**2)  # noqa: E731
    dynamics, ts = dyn(model, 2, 2.0, 0.5), jnp.array([0.5, 1.0])
    circ = tp.solve(dynamics, tp.CircleDensity(lambda th: f(np.cos(th)), 0.7, modes=24), t1=1.0, saveat=ts,
                    stepsize_controller=TIGHT)
    st = tp.ZonalDensity(f, 2, 0.7, degree=24)
    zs = tp.solve(dynamics, st, t1=1.0, saveat=ts, stepsize_controller=TIGHT)
    th = np.asarray(tp.solvers.circle.grid(24))
    np.testing.assert_allclose(np.asarray(st.values(np.cos(th), zs.xs)), np.asarray(circ.xs), atol=1e-9)
    m = np.asarray(tp.solvers.circle.order_parameter(circ.xs))
    np.testing.assert_allclose(np.asarray(zonal.order_parameter(zs.xs, 2)), m, atol=1e-9)


@pytest.mark.slow
def test_solve_density_sees_zonal_space_and_time_errors():
    # clustering USA at K = 1.5 on S¹ outruns degree 12; a resolved one reports an error below tol
    f = lambda u: np.exp(1.2 * u)  # noqa: E731
    with pytest.raises(tp.solvers.UnderResolvedError, match="with degree 12"):
        tp.solve_density(dyn(tp.UnnormalizedAttention, 3, 2.0, 4.0), tp.ZonalDensity(f, 3, 0.7, degree=12), t1=1.0)
    sol = tp.solve_density(dyn(tp.UnnormalizedAttention, 3, 2.0, 0.5), tp.ZonalDensity(f, 3, 0.7, degree=16), t1=0.5)
    assert sol.resolved and 0 < sol.resolution_error < 1e-6 and sol.mass_error < 1e-13
    # a coarse step's time error is not hidden: the check also runs with the control tightened
    coarse = tp.solve_density(dyn(tp.UnnormalizedAttention, 3, 2.0, 0.5), tp.ZonalDensity(f, 3, 0.7, degree=16),
                              t1=0.5, stepsize_controller=diffrax.PIDController(rtol=1e-4, atol=1e-6), throw=False)
    assert coarse.resolution_error > 10 * sol.resolution_error


def test_bad_input():
    with pytest.raises(ValueError, match="d must be"):
        tp.ZonalDensity(np.ones(4), 1)
    with pytest.raises(ValueError, match="must be positive"):
        tp.ZonalDensity(lambda u: u, 3, degree=4)
    with pytest.raises(ValueError, match="needs degree="):
        tp.ZonalDensity(lambda u: 1 + u, 3)
    st = tp.ZonalDensity(np.ones(5), 3, 1.0)
    with pytest.raises(ValueError, match="of shape"):
        tp.solve(dyn(tp.UnnormalizedAttention, 4, 1.0), st, t1=0.1)
    e = jnp.eye(3)
    with pytest.raises(ValueError, match="not a multiple of the identity"):
        tp.solve(tp.Sphere(tp.UnnormalizedAttention(e, jnp.diag(jnp.array([1.0, 2.0, 1.0])), e, 1.0)), st, t1=0.1)
