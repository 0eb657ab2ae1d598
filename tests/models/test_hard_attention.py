"""Hard (β = ∞) attention: a plain NumPy argmax with ties, the β → ∞ limit of softmax with its
exponential rate, causal masking, and finite-time merging against the exact solution."""

import math

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp


def _numpy_hard(queries, x, w, Q, K, V, tol=0.0):
    """For each query: the keys whose score is within tol of the largest (positive mass only),
    averaged with their masses, then V."""
    out = np.zeros((len(queries), x.shape[1]))
    for i, q in enumerate(queries):
        s = np.array([(Q @ q) @ (K @ y) for y in x])
        s[w <= 0] = -np.inf
        ties = (s >= s.max() - tol) & (w > 0)
        out[i] = V @ (w[ties] @ x[ties]) / w[ties].sum()
    return out


def test_hard_attention_matches_a_numpy_argmax_with_ties():
    rng = np.random.default_rng(0)
    Q, K, V = rng.normal(size=(3, 3)), rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    x = np.round(rng.normal(size=(8, 3)), 1)
    x[5] = x[2]  # a duplicated key: an exact tie for every query
    w = rng.uniform(0.1, 1, 8)
    w[6] = 0.0  # a zero-mass key is never chosen
    w /= w.sum()
    attn = tp.HardAttention(Q, K, V)
    np.testing.assert_allclose(attn.velocity(x, w), _numpy_hard(x, x, w, Q, K, V), rtol=1e-12)
    # ties by tolerance: the identity on points of equal norm, two of them at the same angle ± ε
    pts = np.array([[1.0, 0.0], [0.0, 1.0], [math.cos(1e-9), math.sin(1e-9)]])
    hard = tp.HardAttention.identity(2, tol=1e-12)
    np.testing.assert_allclose(hard.field(pts[:1], pts), _numpy_hard(pts[:1], pts, np.ones(3) / 3, *np.eye(2)[None].repeat(3, 0), tol=1e-12), rtol=1e-12)
    np.testing.assert_allclose(hard.field(pts[:1], pts)[0], (pts[0] + pts[2]) / 2, rtol=1e-12)


def test_softmax_converges_to_hard_attention_at_the_rate_of_the_score_gap():
    """Without ties, |Γ_β − Γ_∞| ~ C e^{−βΔ}, Δ the gap between a query's two largest scores:
    the measured decay rate in β is Δ for every token (the next gaps add e^{−βΔ'} terms, small
    at these β)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 2))
    Q, K, V = np.eye(2), np.array([[1.0, 0.3], [-0.2, 0.8]]), np.eye(2)
    hard = np.asarray(tp.HardAttention(Q, K, V).velocity(x))
    s = x @ Q.T @ (x @ K.T).T
    top2 = np.sort(s, axis=1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    betas = np.array([20.0, 25.0]) / gap.min()  # βΔ in [20, 25 Δ/Δ_min]: far from rounding for the smallest gap
    diffs = np.stack([np.linalg.norm(np.asarray(tp.SoftmaxAttention(Q, K, V, b).velocity(x)) - hard, axis=1)
                      for b in betas])
    i = int(np.argmin(gap))  # the other tokens' differences are at rounding already
    assert diffs[1, i] < diffs[0, i]
    rate = np.log(diffs[0, i] / diffs[1, i]) / (betas[1] - betas[0])
    np.testing.assert_allclose(rate, gap[i], rtol=1e-3)


def test_hard_attention_causal_and_negative_beta_limit():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 2))
    w = np.ones(5) / 5
    hard = tp.HardAttention.identity(2)
    causal = np.asarray(tp.Causal(hard).velocity(x))
    for i in range(5):  # token i sees keys 0..i
        np.testing.assert_allclose(causal[i], _numpy_hard(x[i:i + 1], x[: i + 1], w[: i + 1], *np.eye(2)[None].repeat(3, 0))[0])
    # β → −∞: softmax at β = −40/Δ against hard attention with K negated (argmin keys)
    anti = tp.HardAttention(np.eye(2), -np.eye(2), np.eye(2))
    soft = tp.SoftmaxAttention.identity(2, beta=-200.0)
    np.testing.assert_allclose(soft.velocity(x), anti.velocity(x), atol=1e-8)


def test_hard_attention_merges_tokens_in_finite_time():
    """d = 1, Q = V = 1, K = −1, tokens (−2, −1/2, 1/2, 2): the outer ones are ±2e^{−t}, the inner
    ones ±(1/2 − 2(1 − e^{−t})) until they meet at 0 at t* = ln(4/3) and stay there (at 0 every
    score ties; their mean is 0). Euler with step h: the inner pair is within O(h) of the exact
    path, and after t* within a chattering band of width 2h·max|x| about 0."""
    attn = tp.HardAttention(np.eye(1), -np.eye(1), np.eye(1))
    x0 = jnp.array([[-2.0], [-0.5], [0.5], [2.0]])
    h = 1e-3
    ts = jnp.array([0.1, 0.2, 0.4, 0.8])
    sol = tp.solve(attn, x0, t1=0.8, dt0=h, solver=diffrax.Euler(), saveat=diffrax.SaveAt(ts=ts))
    xs = np.asarray(sol.xs)[:, :, 0]
    t = np.asarray(ts)
    tstar = math.log(4 / 3)
    inner = np.where(t < tstar, 0.5 - 2 * (1 - np.exp(-t)), 0.0)
    np.testing.assert_allclose(xs[:, 2], inner, atol=4 * h)
    np.testing.assert_allclose(xs[:, 1], -xs[:, 2], atol=1e-12)
    np.testing.assert_allclose(xs[:, 3], 2 * np.exp(-t), rtol=2 * h)
    assert np.all(np.abs(xs[t > tstar, 2] - xs[t > tstar, 1]) <= 4 * h * 2)  # merged: the pair's gap ~ h
    # a softmax flow at finite β keeps them apart (smooth field: no merging in finite time)
    soft = tp.solve(tp.SoftmaxAttention(np.eye(1), -np.eye(1), np.eye(1), 20.0), x0, t1=0.8, dt0=h,
                    solver=diffrax.Euler(), saveat=diffrax.SaveAt(ts=ts))
    assert float(np.asarray(soft.xs)[-1, 2, 0] - np.asarray(soft.xs)[-1, 1, 0]) > 0


def test_hard_attention_bad_input():
    with pytest.raises(ValueError, match="tol"):
        tp.HardAttention.identity(2, tol=-1.0)
    with pytest.raises(ValueError, match="Q and K"):
        tp.HardAttention(np.eye(2), np.eye(3), np.eye(2))
