"""The normalizing-flow experiment (issue 22 item 5; seed 003, fifth abstract:
Álvarez-López–Geshkovski–Ruiz-Balet, arXiv 2412.19366).

Oracles: an affine flow (one neuron active on every token: v = w(aᵀx + b) is linear) pushes
N(0, I) to a Gaussian known in closed form (scipy's expm); central finite differences of the
loss for its gradient through the density track; the tiny run lowers the KL it started from.
"""

import math

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _runs import tiny_run
from scipy.linalg import expm
from scipy.stats import multivariate_normal

import transformer_pde.experiments.normalizing_flow as nf


@pytest.mark.slow
def test_affine_piece_pushes_the_base_to_the_closed_form_gaussian():
    w = np.array([[0.3], [-0.2]])
    a = np.array([[0.6, 0.8]])
    b = np.array([20.0])  # aᵀx + b > 0 on every token: the field is affine
    T = 1.0
    aug = np.zeros((3, 3))
    aug[:2, :2], aug[:2, 2] = w @ a, (w @ b)
    E = expm(T * aug)
    mean, cov = E[:2, 2], E[:2, :2] @ E[:2, :2].T
    x0 = jax.random.normal(jax.random.key(0), (40, 2))
    controls = tuple(jnp.asarray(v)[None] for v in (w, a, b))
    x, log_rho = nf.push(controls, x0, nf.base_log_density(x0), t1=T, substeps=20, solver=diffrax.Tsit5())
    np.testing.assert_allclose(x, np.asarray(x0) @ E[:2, :2].T + mean, atol=1e-10)
    np.testing.assert_allclose(log_rho, multivariate_normal(mean, cov).logpdf(np.asarray(x)), atol=1e-10)
    # the same flow: KL to its own image is 0
    target = lambda y: nf.gaussian_log_density(y, jnp.asarray(mean), jnp.asarray(cov))  # noqa: E731
    assert abs(float(nf.flow_kl(controls, x0, target, t1=T, substeps=20, solver=diffrax.Tsit5()))) < 1e-10


@pytest.mark.slow
@pytest.mark.parametrize("activation, width", [("relu", 1), ("tanh", 4)])
def test_gradient_through_the_density_track_matches_finite_differences(activation, width):
    controls = nf.init_controls(jax.random.key(1), switches=2, width=width)
    controls = (3.0 * controls[0], controls[1], controls[2])  # a flow that moves the tokens
    x0 = jax.random.normal(jax.random.key(2), (24, 2))
    kw = dict(t1=2.0, substeps=3, solver=diffrax.Heun(), activation=nf.activation_function(activation))

    def loss(c):
        return nf.flow_kl(c, x0, nf.moons_log_density, **kw)

    grad = jax.jit(jax.grad(loss))(controls)
    direction = jax.tree.map(lambda g, k: jax.random.normal(k, g.shape), grad,
                             tuple(jax.random.split(jax.random.key(3), 3)))
    h = 1e-6
    f = jax.jit(lambda s: loss(jax.tree.map(lambda c, d: c + s * d, controls, direction)))
    fd = (float(f(h)) - float(f(-h))) / (2 * h)
    ad = sum(float(jnp.vdot(g, d)) for g, d in zip(grad, direction))
    assert abs(ad) > 1e-2
    assert abs(ad - fd) < 1e-6 * max(1.0, abs(fd))


@pytest.mark.slow
def test_bad_targets_are_clear_errors():
    x0 = jax.random.normal(jax.random.key(4), (8, 2))
    controls = nf.init_controls(jax.random.key(5), switches=0)
    kw = dict(t1=1.0, substeps=1, steps=1)
    with pytest.raises(ValueError, match="not normalizable"):
        nf.fit_flow(lambda y: -jnp.log1p(jnp.sum(y**2, axis=1)), x0, controls, **kw)

    def half_plane(y):  # N(0, I) restricted to y_0 > 0, normalized: zero density on half the base
        return jnp.where(y[:, 0] > 0, nf.base_log_density(y) + math.log(2.0), -jnp.inf)

    with pytest.raises(ValueError, match="zero density .* where the flow sends mass"):
        nf.fit_flow(half_plane, x0, controls, **kw)


@pytest.mark.slow
def test_tiny_run_lowers_the_relative_entropy_and_never_worsens_with_switches(tmp_path_factory):
    res, cfg, _ = tiny_run("normalizing-flow", tmp_path_factory)
    assert res["kl"].shape == res["kl_train"].shape == (len(cfg.targets), len(cfg.switches))
    assert np.all(res["kl"] < res["kl_identity"][:, None])
    assert np.all(res["losses"][..., -1] < res["losses"][..., 0])
    # the kept iterate is the best one seen, and each fit starts where the smaller one ended
    np.testing.assert_array_equal(res["losses"][..., -1], np.nanmin(res["losses"], axis=-1))
    np.testing.assert_array_equal(res["kl_train"], res["losses"][..., -1])
    assert np.all(np.diff(res["kl_train"], axis=1) <= 1e-6 * np.abs(res["kl_train"][:, 1:]))
    np.testing.assert_allclose(res["losses"][:, 1:, 0], res["kl_train"][:, :-1], rtol=1e-5)
    assert np.all(np.isfinite(res["log_rho"])) and np.all(np.isfinite(res["kl_fine"]))


@pytest.mark.slow
@pytest.mark.parametrize("activation, width", [("relu", 1), ("tanh", 3)])
def test_embedded_controls_define_the_same_flow(activation, width):
    """s = 1 (2 pieces) embedded in s = 4 (5 pieces: not a multiple): the same tokens and log ρ."""
    c = nf.init_controls(jax.random.key(8), switches=1, width=width)
    c = (3.0 * c[0], c[1], c[2])
    big = nf.embed_controls(c, 4, jax.random.key(9))
    assert big[1].shape == (5, width, 2)
    x0 = jax.random.normal(jax.random.key(10), (50, 2))
    kw = dict(t1=2.0, substeps=3, solver=diffrax.Heun(), activation=nf.activation_function(activation))
    small_out = nf.push(c, x0, nf.base_log_density(x0), **kw)
    big_out = nf.push(big, x0, nf.base_log_density(x0), **kw)
    for u, v in zip(small_out, big_out):
        np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="cannot be embedded"):
        nf.embed_controls(big, 1, jax.random.key(9))


@pytest.mark.slow
def test_warm_start_never_trains_worse():
    x0 = jax.random.normal(jax.random.key(11), (32, 2))
    kw = dict(t1=2.0, substeps=1, solver=diffrax.Euler(), steps=4, learning_rate=0.05)
    small = nf.fit_flow(nf.moons_log_density, x0, nf.init_controls(jax.random.key(12), 0), **kw)
    start = nf.embed_controls(small.model, 2, jax.random.key(13))
    big = nf.fit_flow(nf.moons_log_density, x0, start, **kw)
    np.testing.assert_allclose(big.losses[0], small.final_loss, rtol=1e-12)
    assert big.final_loss <= small.final_loss


def _closed_form_kl_base_to_gaussian(mean, cov):
    """KL(N(0, I) ‖ N(m, S)) = ½(tr S⁻¹ + mᵀS⁻¹m − d + log det S)."""
    Si = np.linalg.inv(cov)
    return 0.5 * (np.trace(Si) + mean @ Si @ mean - len(mean) + np.linalg.slogdet(cov)[1])


def test_no_flow_kl_against_a_closed_form():
    mean, cov = np.array([0.5, -0.3]), np.array([[1.5, 0.4], [0.4, 0.7]])
    target = lambda y: nf.gaussian_log_density(y, jnp.asarray(mean), jnp.asarray(cov))  # noqa: E731
    value, err = nf.no_flow_kl(target)
    np.testing.assert_allclose(value, _closed_form_kl_base_to_gaussian(mean, cov), rtol=1e-12)
    assert err < 1e-12


@pytest.mark.slow
def test_no_flow_kl_of_the_moons_against_adaptive_quadrature():
    """scipy's adaptive dblquad of a plain NumPy moons density (the integrand is smooth)."""
    from scipy.integrate import dblquad
    from scipy.special import logsumexp

    th = np.linspace(0.0, np.pi, 8)
    centres = 1.5 * (np.concatenate([np.stack([np.cos(th), np.sin(th)], 1),
                                     np.stack([1 - np.cos(th), 0.5 - np.sin(th)], 1)]) - [0.5, 0.25])

    def integrand(y, x):
        log_base = -0.5 * (x * x + y * y) - math.log(2 * math.pi)
        d2 = (x - centres[:, 0]) ** 2 + (y - centres[:, 1]) ** 2
        log_moons = logsumexp(-0.5 * d2 / 0.25**2) - math.log(16) - math.log(2 * math.pi * 0.25**2)
        return math.exp(log_base) * (log_base - log_moons)

    reference, _ = dblquad(integrand, -9.0, 9.0, -9.0, 9.0, epsabs=1e-9, epsrel=1e-9)
    value, err = nf.no_flow_kl(nf.moons_log_density)
    assert err < 1e-9
    np.testing.assert_allclose(value, reference, rtol=1e-8)


@pytest.mark.slow
def test_quadrature_kl_converges_and_agrees_with_monte_carlo():
    """The loss on the Gauss–Hermite rule of the base: refinement settles it (the pushed density
    jumps across the images of the ReLU kinks, so the rule converges slowly, not spectrally),
    and a large Monte Carlo sample agrees within its standard error."""
    c = nf.init_controls(jax.random.key(1), 2)
    c = (3.0 * c[0], c[1], c[2])
    kw = dict(t1=2.0, substeps=3, solver=diffrax.Heun())
    quad = {}
    for m in (32, 192, 256):
        nodes, weights = nf.base_rule(m)
        quad[m] = float(nf.flow_kl(c, nodes, nf.moons_log_density, weights=weights, **kw))
    assert abs(quad[256] - quad[192]) < 1e-3 < abs(quad[192] - quad[32])
    x0 = jax.random.normal(jax.random.key(100), (1 << 18, 2))
    x, log_rho = nf.push(c, x0, nf.base_log_density(x0), **kw)
    terms = np.asarray(log_rho - nf.moons_log_density(x))
    se = terms.std() / math.sqrt(terms.size)
    assert abs(terms.mean() - quad[256]) < 3 * se + 1e-3


@pytest.mark.slow
def test_fit_on_the_quadrature_rule_lowers_the_rule_kl():
    nodes, weights = nf.base_rule(8)
    c0 = nf.init_controls(jax.random.key(14), 1)
    kw = dict(t1=2.0, substeps=1, solver=diffrax.Euler())
    res = nf.fit_flow(nf.moons_log_density, nodes, c0, steps=3, learning_rate=0.05, weights=weights, **kw)
    np.testing.assert_allclose(res.losses[0], float(nf.flow_kl(c0, nodes, nf.moons_log_density, weights=weights, **kw)),
                               rtol=1e-12)
    assert res.final_loss < res.losses[0]
