"""Causal attention (tp.Causal), its clustering to the first token, Rényi parking (docs: math/causal.md)."""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _runs import tiny_run

import transformer_pde as tp
from transformer_pde.theory import causal_clustering


def test_causal_attention_matches_masked_softmax_and_alibi_reference():
    x = tp.uniform_sphere(jax.random.key(0), 7, 3)
    ca = tp.Causal(tp.SoftmaxAttention.identity(3, 2.0), alibi=0.0)
    sm = tp.Causal(tp.SoftmaxAttention.identity(3, 2.0))
    np.testing.assert_allclose(ca.velocity(x), sm.velocity(x), rtol=1e-12)
    lam, beta = 1.5, 2.0
    xv = np.asarray(x)
    v = np.asarray(tp.Causal(tp.SoftmaxAttention.identity(3, beta), alibi=lam, include_self=False).velocity(x))
    for k in range(7):
        if k == 0:
            np.testing.assert_array_equal(v[0], 0.0)
            continue
        w = np.array([np.exp(beta * xv[k] @ xv[j] - lam * (k - j) / 7) for j in range(k)])
        np.testing.assert_allclose(v[k], (w / w.sum()) @ xv[:k], rtol=1e-12)
    with pytest.raises(ValueError, match="alibi"):
        tp.Causal(tp.SoftmaxAttention.identity(3, 1.0), alibi=-1.0)


@pytest.mark.slow
@pytest.mark.parametrize("d", [2, 3])
def test_all_tokens_go_to_the_first_token(d):
    # sphere.md §4 Thm 1 with Q = K = V = I (the case the spec marks as checked)
    x0 = tp.uniform_sphere(jax.random.key(d), 10, d)
    dyn = tp.Sphere(tp.Causal(tp.SoftmaxAttention.identity(d, 1.0)))
    sol = tp.solve(dyn, x0, t1=60.0, dt0=0.2, solver=diffrax.Tsit5())
    np.testing.assert_allclose(sol.final[0], x0[0], atol=1e-12)  # x_1 never moves
    assert float(jnp.max(jnp.linalg.norm(sol.final - x0[0][None, :], axis=-1))) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("d", [2, 3])
def test_renyi_expected_count(d):
    delta, n, reps = 0.5, 40, 400
    keys = jax.random.split(jax.random.key(1), reps)
    counts = jax.vmap(lambda k: tp.diagnostics.renyi_centers(tp.uniform_sphere(k, n, d), delta).sum())(keys)
    expected = causal_clustering.expected_renyi_centers(n, d, delta)
    se = float(np.std(counts)) / np.sqrt(reps)
    assert abs(float(np.mean(counts)) - expected) < 4 * se
    # the cap measure against Monte Carlo (and the general-d formula against d = 3)
    y = tp.uniform_sphere(jax.random.key(2), 100000, d)
    frac = float(jnp.mean(jnp.arccos(jnp.clip(y[:, 0], -1, 1)) <= delta))
    assert abs(frac - causal_clustering.cap_measure(delta, d)) < 4 * np.sqrt(frac / 100000)


@pytest.mark.parametrize("d", [4, 5, 8])
def test_cap_measure_general_d_against_monte_carlo(d):
    """The incomplete-beta branch (d >= 4), both halves (δ below and above π/2), against the
    fraction of uniform points within geodesic distance δ of a pole (Gaussian directions, NumPy)."""
    m = 200_000
    z = np.random.default_rng(d).standard_normal((m, d))
    angle = np.arccos(np.clip(z[:, 0] / np.linalg.norm(z, axis=1), -1, 1))
    for delta in (0.3, 1.2, np.pi / 2, 2.0, 2.9):
        frac = np.mean(angle <= delta)
        p = causal_clustering.cap_measure(delta, d)
        assert abs(frac - p) < 5 * np.sqrt(max(p * (1 - p), 1 / m) / m), (d, delta, frac, p)
    assert causal_clustering.cap_measure(np.pi, d) == pytest.approx(1.0, abs=1e-12)
    assert causal_clustering.cap_measure(0.0, d) == 0.0


@pytest.mark.slow
def test_experiment_causal_clustering_tiny(tmp_path_factory):
    res, cfg, _ = tiny_run("causal-clustering", tmp_path_factory)
    assert float(res["long_final_dist"]) < 1e-3  # everything at x_1(0)
    # metastable counts grow with β, within the Rényi band (±2 for small n), slope near 1/2
    m = res["mean_count"]
    assert np.all(np.diff(m) > 0)
    assert np.all(m >= res["expected_renyi_low"] - 2) and np.all(m <= res["expected_renyi_high"] + 2)
    assert abs(float(res["slope"]) - 0.5) < 0.2


@pytest.mark.slow
def test_float32_paths():
    x = tp.uniform_sphere(jax.random.key(0), 6, 3, dtype=jnp.float32)
    eye = jnp.eye(3, dtype=jnp.float32)
    v = tp.Causal(tp.SoftmaxAttention(eye, eye, eye, 2.0), alibi=0.5).velocity(x)
    assert v.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(v)))



def test_alibi_is_a_reweighting_of_the_keys_in_every_normalized_attention():
    """In a normalized attention e^{−λ(i−j)/N} loses its row factor e^{−λi/N}: ALiBi equals the
    causal attention of the keys reweighted w_j e^{λj/N} (renormalized), for softmax, ℓ² and
    multi-head alike; and the key bias of causal_field multiplies a key's mass in every
    maskable attention (sigmoid and USA, whose sums are linear in the masses, included)."""
    rng = np.random.default_rng(4)
    n, d, lam = 11, 3, 1.3
    x = jnp.asarray(rng.normal(size=(n, d)))
    w = jnp.asarray(rng.dirichlet(np.ones(n)))
    Q, K, V = (rng.normal(size=(d, d)) / 2 for _ in range(3))
    tilted = w * np.exp(lam * np.arange(n) / n)
    tilted = tilted / tilted.sum()
    for attn in (tp.SoftmaxAttention(Q, K, V, 0.9), tp.L2Attention(Q, K, V, 0.4),
                 tp.MultiHeadAttention.split(Q, K, V, 1, 0.9), tp.MultiHeadAttention(
                     np.stack([Q, K]), np.stack([K, V]), V, np.eye(d) / 2, 0.9)):
        for include_self in (True, False):
            np.testing.assert_allclose(tp.Causal(attn, alibi=lam, include_self=include_self).velocity(x, w),
                                       tp.Causal(attn, include_self=include_self).velocity(x, tilted),
                                       rtol=1e-11, atol=1e-14)
    bias = jnp.asarray(rng.normal(size=n))
    for attn in (tp.SigmoidAttention(Q, K, V, 0.9, bias=-0.3), tp.UnnormalizedAttention(Q, K, V, 0.9, shift=0.2)):
        np.testing.assert_allclose(attn.causal_field(x, x, w, 0.0, 0, bias),
                                   attn.causal_field(x, x, w * jnp.exp(bias), 0.0, 0), rtol=1e-11, atol=1e-14)
