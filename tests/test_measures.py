"""Quadrature rules as initial measures: exactness on known integrals, refinement of the evolved
rule at the rule's (spectral) order on S¹ and S², clear errors for bad input."""


import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde import measures


def test_circle_rule_integrates_trigonometric_polynomials_exactly():
    eps, k = 0.3, 2
    rho = lambda x: 1 + eps * jnp.cos(k * jnp.arctan2(x[:, 1], x[:, 0]))  # noqa: E731
    p = tp.CircleRule()(rho, 9)
    th = np.arctan2(p.x[:, 1], p.x[:, 0])
    w = np.asarray(p.weights)
    # ∫ cos²(kθ) ρ dθ/2π / ∫ ρ dθ/2π = 1/2; ∫ cos(kθ) ρ = eps/2 (degrees <= 8 < 9 nodes)
    np.testing.assert_allclose(w @ np.cos(k * th), eps / 2, rtol=1e-13)
    np.testing.assert_allclose(w @ np.cos(k * th) ** 2, 0.5, rtol=1e-13)
    np.testing.assert_allclose(np.linalg.norm(p.x, axis=1), 1.0, rtol=1e-15)


def test_sphere_rule_is_exact_to_degree_2_order_minus_1():
    p = tp.SphereRule()(None, 4)  # degree <= 7
    x, w = np.asarray(p.x), np.asarray(p.weights)
    assert x.shape == (32, 3)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, rtol=1e-14)
    # uniform law on S²: E x_i² = 1/3, E x_1² x_2² = 1/15, E x_1² x_2² x_3² = 1/105, E x_3⁴ = 1/5
    np.testing.assert_allclose(w @ x**2, [1 / 3] * 3, rtol=1e-13)
    np.testing.assert_allclose(w @ (x[:, 0] ** 2 * x[:, 1] ** 2), 1 / 15, rtol=1e-13)
    np.testing.assert_allclose(w @ (x[:, 0] ** 2 * x[:, 1] ** 2 * x[:, 2] ** 2), 1 / 105, rtol=1e-13)
    np.testing.assert_allclose(w @ x[:, 0] ** 4, 1 / 5, rtol=1e-13)
    # a von Mises–Fisher density: E⟨c, x⟩ = coth κ − 1/κ (spectral accuracy at 16 nodes)
    kappa, c = 3.0, np.array([0.0, 0.6, 0.8])
    q = tp.SphereRule()(lambda y: jnp.exp(kappa * y @ c), 16)
    np.testing.assert_allclose(np.asarray(q.weights) @ (np.asarray(q.x) @ c), 1 / np.tanh(kappa) - 1 / kappa,
                               rtol=1e-12)


def test_mapped_gauss_hermite_rule():
    """ρ(x) ∝ (1 + x_1²) N(0, I) in R²: the mapped rule is exact (ρ/φ a polynomial)."""
    rule = tp.GaussHermiteRule(jnp.zeros(2), jnp.eye(2))
    p = rule(lambda x: (1 + x[:, 0] ** 2) * jnp.exp(-0.5 * jnp.sum(x**2, -1)), 6)
    x, w = np.asarray(p.x), np.asarray(p.weights)
    # E_ρ[x_1²] = E_φ[x_1² + x_1⁴]/E_φ[1 + x_1²] = (1 + 3)/2; E_ρ[x_2²] = 1
    np.testing.assert_allclose(w @ x[:, 0] ** 2, 2.0, rtol=1e-12)
    np.testing.assert_allclose(w @ x[:, 1] ** 2, 1.0, rtol=1e-12)
    # the Gaussian itself: the tensor rule of tp.Gaussian.gauss_hermite
    g = tp.Gaussian(jnp.array([0.5]), jnp.array([[2.0]]))
    q = tp.GaussHermiteRule(g.mean, g.cov)(None, 5)
    np.testing.assert_allclose(np.asarray(q.weights) @ np.asarray(q.x[:, 0]) ** 4,
                               0.5**4 + 6 * 0.5**2 * 2 + 3 * 4, rtol=1e-12)


def test_bad_rules_and_densities_are_clear_errors():
    with pytest.raises(ValueError, match="order >= 1"):
        tp.CircleRule()(None, 0)
    with pytest.raises(ValueError, match="order >= 1"):
        tp.SphereRule()(None, -1)
    with pytest.raises(ValueError, match="not normalizable"):
        tp.CircleRule()(lambda x: jnp.zeros(x.shape[0]), 8)
    with pytest.raises(ValueError, match="negative"):
        tp.CircleRule()(lambda x: x[:, 0], 8)
    with pytest.raises(ValueError, match="not finite"):
        tp.SphereRule()(lambda x: 1 / (x[:, 2] - x[:, 2]), 3)
    with pytest.raises(ValueError, match="one value per point"):
        tp.CircleRule()(lambda x: 1.0, 4)
    # Lebesgue measure on R (not normalizable) and a Cauchy law (heavier than the Gaussian)
    rule = tp.GaussHermiteRule(jnp.zeros(1), jnp.eye(1))
    with pytest.raises(ValueError, match="not resolved"):
        rule(lambda x: jnp.ones(x.shape[0]), 12)
    with pytest.raises(ValueError, match="not resolved"):
        rule(lambda x: 1 / (1 + x[:, 0] ** 2), 12)
    with pytest.raises(ValueError, match="d <= 3"):
        tp.GaussHermiteRule(jnp.zeros(4), jnp.eye(4))


def _padded(rule, density, orders):
    """Rules of several orders padded with zero-weight tokens to one size (a zero weight does
    not act): one compiled solve evolves them all."""
    rules = [rule(density, m) for m in orders]
    size = max(r.x.shape[0] for r in rules)
    xs = jnp.stack([jnp.concatenate([r.x, jnp.repeat(r.x[:1], size - r.x.shape[0], 0)]) for r in rules])
    ws = jnp.stack([jnp.concatenate([r.weights, jnp.zeros(size - r.x.shape[0])]) for r in rules])
    return xs, ws


def _evolved_moments(dyn, xs, ws, t1, dt0):
    def one(x, w):
        sol = tp.solve(dyn, tp.Particles(x, w), t1=t1, dt0=dt0, solver=diffrax.Tsit5(),
                               saveat=diffrax.SaveAt(t1=True))
        y = sol.xs[-1]
        m = w @ y
        yc = y - m[None, :]
        return m, (w[:, None] * yc).T @ yc

    return jax.jit(jax.vmap(one))(xs, ws)


def _gaps(m, S):
    """Distance of each rule's moments to the finest rule's."""
    m, S = np.asarray(m), np.asarray(S)
    return np.linalg.norm(S[:-1] - S[-1:], axis=(1, 2)) + np.linalg.norm(m[:-1] - m[-1:], axis=1)


def _decay_rate(orders, errors):
    """The slope of log(error) against the order: the rule's exponential order."""
    return np.polyfit(np.asarray(orders, float), np.log(errors), 1)[0]


@pytest.mark.slow
def test_evolved_circle_rule_converges_spectrally():
    """SA on S¹ at β = 4 from 1 + 0.3 cos 2θ (the law moves: its covariance changes by O(0.1)):
    the moments of the evolved trapezoid rule at t = 1 converge geometrically in the number of
    nodes (measured: error ∝ e^{−0.61 m}, from 3.0e-3 at m = 8 to 8.4e-12 at m = 40)."""
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(2, 4.0))
    rho = lambda x: 1 + 0.3 * jnp.cos(2 * jnp.arctan2(x[:, 1], x[:, 0]))  # noqa: E731
    orders = [8, 16, 24, 32, 40, 64]
    xs, ws = _padded(tp.CircleRule(), rho, orders)
    m, S = _evolved_moments(dyn, xs, ws, 1.0, 0.05)
    err = _gaps(m, S)
    S0 = np.einsum("j,ja,jb->ab", ws[-1], xs[-1], xs[-1])
    assert np.linalg.norm(np.asarray(S[-1]) - S0) > 0.05  # a moving law
    rate = _decay_rate(orders[:-1], np.maximum(err, 1e-16))
    assert rate < -0.4, (rate, err)
    assert err[-1] < 1e-10 and np.all(np.diff(np.log(err[:4])) < 0), err


@pytest.mark.slow
def test_evolved_sphere_rule_converges_spectrally():
    """SA on S² at β = 2 from a von Mises–Fisher cap (κ = 2): the moments of the evolved
    Gauss–Legendre × trapezoid rule at t = 1 converge geometrically in the order (measured:
    ∝ e^{−1.54 order}, from 0.13 at order 2 to 3.0e-7 at order 10)."""
    dyn = tp.Sphere(tp.SoftmaxAttention.identity(3, 2.0))
    c = jnp.array([0.0, 0.6, 0.8])
    orders = [2, 4, 6, 8, 10, 16]
    xs, ws = _padded(tp.SphereRule(), lambda x: jnp.exp(2.0 * x @ c), orders)
    m, S = _evolved_moments(dyn, xs, ws, 1.0, 0.1)
    err = _gaps(m, S)
    rate = _decay_rate(orders[:-1], np.maximum(err, 1e-16))
    assert rate < -1.0, (rate, err)
    assert err[-1] < 1e-6 and np.all(np.diff(np.log(err)) < 0), err


def test_rules_refuse_orders_over_the_node_budget_before_allocating():
    # 2**31 - 1 passes the integer check: each rule must refuse it by its node count, naming order
    for rule, order in ((tp.CircleRule(), measures.MAX_NODES + 1), (tp.SphereRule(), 2237),
                        (tp.GaussHermiteRule(jnp.zeros(2), jnp.eye(2)), 3163)):
        with pytest.raises(ValueError, match=r"order=\d+ gives \d+ nodes"):
            rule(None, order)
    assert tp.SphereRule().num_nodes(2236) <= measures.MAX_NODES  # the bound is the count, not the order
    with pytest.raises(ValueError, match="order="):
        tp.CircleRule()(None, 2**31 - 1)


def test_complex_densities_are_refused_not_cast():
    for rule, order in ((tp.CircleRule(), 8), (tp.SphereRule(), 3), (tp.GaussHermiteRule(jnp.zeros(1), jnp.eye(1)), 4)):
        with pytest.raises(ValueError, match="real values, got dtype complex"):
            rule(lambda x: jnp.ones(x.shape[0]) + 0.5j, order)
    with pytest.raises(ValueError, match="real values"):
        tp.CircleRule()(lambda x: np.array(["a"] * x.shape[0]), 4)


def test_gauss_hermite_density_vanishing_where_one_over_phi_overflows():
    """ρ = 0 on the far nodes, where 1/φ overflows float64 (d = 2, order 300: |z|² up to ~2280):
    ρ/φ is 0 there, not 0·inf = NaN. Reference: w^GH·ρ/φ in plain NumPy on the kept nodes, the
    far nodes dropped by hand."""
    rule = tp.GaussHermiteRule(jnp.zeros(2), jnp.eye(2))

    def rho(x):  # uniform on the square [-10, 10]², zero elsewhere
        return jnp.where(jnp.max(jnp.abs(x), axis=1) <= 10.0, 1.0, 0.0)

    pts, w = rule.nodes(300)
    r2 = np.sum(pts**2, axis=1)
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.exp(r2 / 2)).all()  # the case: 1/φ overflows on far nodes
    keep = np.max(np.abs(pts), axis=1) <= 10.0
    ref = np.zeros_like(w)
    ref[keep] = w[keep] * 2 * np.pi * np.exp(r2[keep] / 2)
    q = rule(rho, 300)
    np.testing.assert_allclose(np.asarray(q.weights), ref / ref.sum(), rtol=1e-10, atol=1e-300)


def test_gauss_hermite_orders_numpy_cannot_compute_are_refused():
    with pytest.raises(ValueError, match="order=400"):
        tp.Gaussian(jnp.zeros(1), jnp.eye(1)).gauss_hermite(400)


def test_quadrature_laws_check_the_node_budget_when_built():
    """A law's rule is built later (by a convergence study); its order is checked at once."""
    from transformer_pde import convergence

    with pytest.raises(ValueError, match=r"SphereRule: order=3000 gives 18000000 nodes"):
        convergence.vmf_cap_law(np.array([1.0, 0.0, 0.0]), 2.0, order=3000)
    with pytest.raises(ValueError, match=r"GaussHermiteRule: order=4000 gives 16000000 nodes"):
        convergence.gaussian_quadrature_law(tp.Gaussian(np.zeros(2), np.eye(2)), order=4000)
    with pytest.raises(ValueError, match=r"64·order = 12800000 points"):
        convergence.perturbed_circle_law(0.1, 1, order=200_000)
    with pytest.raises(ValueError, match=r"resolution = 20000000 points"):
        convergence.perturbed_circle_law(0.1, 1, order=16, resolution=20_000_000)
    assert convergence.perturbed_circle_law(0.1, 1, order=16).order == 16
