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
def test_gradient_through_the_density_track_matches_finite_differences():
    controls = nf.init_controls(jax.random.key(1), switches=2)
    controls = (3.0 * controls[0], controls[1], controls[2])  # a flow that moves the tokens
    x0 = jax.random.normal(jax.random.key(2), (24, 2))
    kw = dict(t1=2.0, substeps=3, solver=diffrax.Heun())

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
def test_tiny_run_lowers_the_relative_entropy(tmp_path_factory):
    res, cfg, _ = tiny_run("normalizing-flow", tmp_path_factory)
    assert res["kl"].shape == (len(cfg.targets), len(cfg.switches))
    assert np.all(res["kl"] < res["kl_identity"][:, None])
    assert np.all(res["losses"][..., -1] < res["losses"][..., 0])
    assert np.all(np.isfinite(res["log_rho"]))
