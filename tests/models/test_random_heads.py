"""Random multi-head attention: chain, common-noise SDE, zero drift, logistic law (sphere.md §5)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _runs import tiny_run

import transformer_pde as tp
from transformer_pde.models import random_heads as rh
from transformer_pde.solvers import random_transformer as rh_runs


def test_head_field_matches_numpy_and_is_odd_in_V():
    x = np.asarray(tp.uniform_sphere(jax.random.key(0), 5, 3))
    heads = rh.GaussianHeads(3, beta=1.7, k=2)
    V, W, Wp = (np.asarray(a) for a in heads.sample(jax.random.key(1)))
    A = W @ Wp.T
    ref = np.zeros_like(x)
    for i in range(5):
        w = np.array([np.exp(1.7 * (A @ x[i]) @ x[j]) for j in range(5)])
        ref[i] = V @ ((w / w.sum()) @ x)
    out = np.asarray(rh.head_field(jnp.asarray(x), V, W, Wp, 1.7))
    np.testing.assert_allclose(out, ref, rtol=1e-12)
    # the symmetry V -> -V behind b = 0 in the Gaussian case
    np.testing.assert_allclose(rh.head_field(jnp.asarray(x), -V, W, Wp, 1.7), -out, rtol=1e-12)


def test_gaussian_drift_vanishes_and_shifted_does_not():
    x = tp.uniform_sphere(jax.random.key(0), 4, 3)
    b, se = rh.expected_head(jax.random.key(1), rh.GaussianHeads(3, beta=1.0), x, 2000)
    z2 = float(jnp.mean((b / se) ** 2))
    assert z2 < 2.5  # E z² = 1 if b = 0
    b1, se1 = rh.expected_head(jax.random.key(1), rh.GaussianHeads(3, beta=1.0, v_mean=1.0), x, 2000)
    assert float(jnp.max(jnp.abs(b1 / se1))) > 10


def test_one_layer_moments_match_the_sde_generator():
    # mean and covariance of one layer, divided by ds, against the SDE's drift and diffusion
    # (module docstring; at β = 0, m_A = x̄ exactly)
    n, d, ds = 3, 4, 1e-3
    heads = rh.GaussianHeads(d, beta=0.0)
    x = tp.uniform_sphere(jax.random.key(3), n, d)
    keys = jax.random.split(jax.random.key(4), 40000)
    x1 = jax.vmap(lambda k: rh_runs.diffusive_chain(k, heads, x, ds, 1)[-1])(keys)
    dx = np.asarray(x1 - x[None])
    xb = np.asarray(x).mean(0)
    drift = -0.5 * (xb @ xb) * np.asarray(x)
    tol = 0.05 * np.abs(drift).max() + 4 * dx.std(0).max() / np.sqrt(len(dx)) / ds
    np.testing.assert_allclose(dx.mean(0) / ds, drift, atol=tol)
    # covariance of token 0 and token 1 increments: (|x̄|²/(d−1)) P⊥_0 P⊥_1
    P = [np.eye(d) - np.outer(xi, xi) for xi in np.asarray(x)]
    cov = np.einsum("pa,pb->ab", dx[:, 0], dx[:, 1]) / len(dx) / ds
    np.testing.assert_allclose(cov, (xb @ xb) / (d - 1) * P[0] @ P[1], atol=0.03)


@pytest.mark.slow
def test_sde_stays_on_sphere_and_validates():
    heads = rh.GaussianHeads(3, beta=1.0)
    x0 = tp.uniform_sphere(jax.random.key(0), 4, 3)
    xs = rh_runs.sde(jax.random.key(1), heads, x0, 1.0, 1 / 16, num_nodes=4, saveat=jnp.linspace(0, 1, 5))
    assert xs.shape == (5, 4, 3)
    np.testing.assert_allclose(jnp.linalg.norm(xs, axis=-1), 1.0, atol=1e-12)
    with pytest.raises(ValueError, match="v_mean"):
        rh_runs.sde(jax.random.key(1), rh.GaussianHeads(3, v_mean=1.0), x0, 1.0, 0.1)
    with pytest.raises(ValueError, match="d must be >= 2, got 1"):
        rh.GaussianHeads(1)


def test_chain_float32():
    heads = rh.GaussianHeads(3, beta=1.0)
    x0 = tp.uniform_sphere(jax.random.key(0), 4, 3, dtype=jnp.float32)
    xs = rh_runs.chain(jax.random.key(1), heads, x0, 8, 0.3, num_heads=2, save_every=4)
    assert xs.shape == (3, 4, 3) and xs.dtype == jnp.float32


@pytest.mark.slow
def test_experiment_random_heads_tiny(tmp_path_factory):
    res, cfg, _ = tiny_run("random-heads", tmp_path_factory)
    assert float(np.mean((res["b_gauss"] / res["b_gauss_se"]) ** 2)) < 2.5
    assert float(res["b_shift_z"]) > 10
    # the deep chain agrees with the common-noise SDE (its weak limit) within Monte Carlo error;
    # the 1/L decay itself needs the default size (the figure), see the experiment
    e, se = np.abs(res["weak_error"]), res["weak_error_se"]
    assert e[-1] < 4 * se[-1]
    assert abs(float(res["m_sde"]) - float(res["m0"])) > 5 * float(res["se_sde"])  # it did move
    # logistic law: error O(1/d) (d = 8 -> 32)
    err = res["logistic_err"]
    assert err[1] < 0.15 and err[0] / err[1] > 1.5
