"""Exact 1-D transport distances against SciPy (R) and against a brute force and the transport
linear program (circle)."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
import scipy.stats

from transformer_pde import diagnostics as dg


def _weights(rng, n, zeros=False):
    w = rng.uniform(0.1, 1.0, n)
    if zeros:
        w[rng.choice(n, n // 4, replace=False)] = 0.0
    return w / w.sum()


@pytest.mark.parametrize("n,m", [(1, 1), (7, 7), (13, 30), (200, 57)])
def test_line_w1_matches_scipy_weighted(n, m):
    rng = np.random.default_rng(n + m)
    x, y = rng.normal(size=n), 0.7 * rng.standard_t(3, size=m) + 0.4
    a, b = _weights(rng, n, zeros=n > 4), _weights(rng, m)
    got = dg.wasserstein_line(x, y, a, b)
    np.testing.assert_allclose(got, scipy.stats.wasserstein_distance(x, y, a, b), rtol=1e-12, atol=1e-15)
    # uniform weights, ties, and (n, 1) point arrays
    xt = np.round(x, 1)
    np.testing.assert_allclose(dg.wasserstein_line(xt[:, None], y[:, None]),
                               scipy.stats.wasserstein_distance(xt, y), rtol=1e-12, atol=1e-15)


def _lp_wasserstein(x, y, a, b, cost):
    n, m = len(x), len(y)
    C = cost(x[:, None], y[None, :])
    A = np.concatenate([np.kron(np.eye(n), np.ones((1, m))), np.kron(np.ones((1, n)), np.eye(m))])
    res = scipy.optimize.linprog(C.ravel(), A_eq=A, b_eq=np.concatenate([a, b]), bounds=(0, None),
                                 method="highs")
    return res.fun


@pytest.mark.parametrize("p", [2.0, 3.0])
def test_line_wp_matches_the_transport_program(p):
    rng = np.random.default_rng(int(p))
    x, y = rng.normal(size=11), rng.uniform(-1, 2, size=9)
    a, b = _weights(rng, 11), _weights(rng, 9)
    lp = _lp_wasserstein(x, y, a, b, lambda u, v: np.abs(u - v) ** p) ** (1 / p)
    np.testing.assert_allclose(dg.wasserstein_line(x, y, a, b, p=p), lp, rtol=1e-9)
    # a translation: W_p(μ, μ(· − c)) = |c| for every p
    np.testing.assert_allclose(dg.wasserstein_line(x, x + 0.3, a, a, p=p), 0.3, rtol=1e-12)


def _circle_brute_force(x, y, a, b, L, grid=100_001):
    """min over the shift c of ∫|F_μ − F_ν − c| dθ, F evaluated on a fine grid, every shift in a
    fine range and every level of F tried (no median formula)."""
    th = (np.arange(grid) + 0.5) * L / grid
    F = (np.mod(x, L)[None, :] <= th[:, None]) @ a - (np.mod(y, L)[None, :] <= th[:, None]) @ b
    cs = np.concatenate([np.linspace(F.min(), F.max(), 1001), np.unique(F)])
    vals = [np.mean(np.abs(F - c)) * L for c in cs]
    return min(vals)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_circle_w1_matches_brute_force_and_the_transport_program(seed):
    rng = np.random.default_rng(seed)
    n, m, L = 9, 12, 2 * math.pi
    x = rng.vonmises(1.0, 3.0, n) + 2 * math.pi * rng.integers(-2, 3, n)  # angles beyond one turn
    y = rng.uniform(-math.pi, math.pi, m)
    a, b = _weights(rng, n, zeros=seed == 1), _weights(rng, m)
    got = float(dg.wasserstein_circle(x, y, a, b))
    geodesic = lambda u, v: np.minimum(np.mod(u - v, L), np.mod(v - u, L))  # noqa: E731
    np.testing.assert_allclose(got, _lp_wasserstein(x, y, a, b, geodesic), rtol=1e-9)
    np.testing.assert_allclose(got, _circle_brute_force(x, y, a, b, L), rtol=2e-4)
    # tokens on S^1 give the same as their angles; another period rescales
    pts = lambda t: np.stack([np.cos(t), np.sin(t)], -1)  # noqa: E731
    np.testing.assert_allclose(dg.wasserstein_circle(pts(x), pts(y), a, b), got, rtol=1e-12)
    np.testing.assert_allclose(dg.wasserstein_circle(x / L, y / L, a, b, period=1.0), got / L, rtol=1e-12)


def test_circle_w1_closed_forms_and_jit():
    # a rotation by δ < π of any measure costs at most δ, exactly δ for a point mass
    np.testing.assert_allclose(dg.wasserstein_circle(jnp.array([0.1]), jnp.array([2.0])), 1.9, rtol=1e-14)
    np.testing.assert_allclose(dg.wasserstein_circle(jnp.array([0.1]), jnp.array([6.0])),
                               2 * math.pi - 5.9, rtol=1e-12)
    # n equally spaced atoms vs the same rotated by half a spacing: each atom moves h/2
    n = 64
    t = 2 * math.pi * jnp.arange(n) / n
    np.testing.assert_allclose(jax.jit(dg.wasserstein_circle)(t, t + math.pi / n), math.pi / n, rtol=1e-12)
    np.testing.assert_allclose(jax.jit(dg.wasserstein_line)(t, t + 0.25), 0.25, rtol=1e-12)
    # vmappable over a batch of measures: rotations of a point mass cost the arc
    shifts = jnp.array([0.0, 0.1, 0.2, 4.0])
    np.testing.assert_allclose(jax.vmap(lambda s: dg.wasserstein_circle(t[:1], t[:1] + s))(shifts),
                               [0.0, 0.1, 0.2, 2 * math.pi - 4.0], atol=1e-12)


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="sum to 1"):
        dg.wasserstein_line([0.0, 1.0], [0.0], [0.5, 0.6])
    with pytest.raises(ValueError, match="p must be >= 1"):
        dg.wasserstein_line([0.0], [1.0], p=0.5)
    with pytest.raises(ValueError, match="points on a line"):
        dg.wasserstein_line(np.zeros((3, 2)), [1.0])
    with pytest.raises(ValueError, match="angles"):
        dg.wasserstein_circle(np.zeros((3, 3)), [1.0])


def test_circle_tokens_need_a_direction_and_period_two_pi():
    """Tokens on S^1 have angles of period 2π (another period was silently used) and a zero
    token has no angle (arctan2 gave it 0) (issue 37 part 9)."""
    t = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    s = np.array([[0.6, 0.8], [0.0, -1.0], [1.0, 0.0]])
    angles = lambda z: np.arctan2(z[:, 1], z[:, 0])  # noqa: E731
    np.testing.assert_allclose(dg.wasserstein_circle(t, s), dg.wasserstein_circle(angles(t), angles(s)), rtol=1e-12)
    with pytest.raises(ValueError, match=r"period must be 2π when x and y are tokens on S\^1"):
        dg.wasserstein_circle(t, s, period=1.0)
    with pytest.raises(ValueError, match=r"period must be 2π when y is tokens"):
        dg.wasserstein_circle(angles(t), s, period=3.0)
    with pytest.raises(ValueError, match=r"x\[1\] is the zero vector: a token on S\^1 needs a direction"):
        dg.wasserstein_circle(np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]), s)
    f = eqx.filter_jit(lambda z: dg.wasserstein_circle(z, s))
    with pytest.raises(Exception, match="x holds a zero vector"):
        jax.block_until_ready(f(jnp.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])))
    # a traced period: refused by the type checks on in tests, else by eqx.error_if (the fuzz)
    with pytest.raises(Exception, match="period"):
        jax.block_until_ready(eqx.filter_jit(lambda pr: dg.wasserstein_circle(t, s, period=pr))(jnp.asarray(3.0)))


@pytest.mark.parametrize("p", [400.0, 2000.0, 1e300])
def test_wasserstein_line_at_large_p(p):
    """W_p -> the largest gap of the quantile functions as p grows; |gap|^p overflowed (gaps > 1)
    or underflowed (gaps < 1) to inf or 0 (issue 37 part 9). Reference: NumPy on the sorted
    points (uniform weights, equal sizes: the quantile functions pair them in order), the mean
    of (gap/max)^p taken with the largest gap factored out."""
    x, y = np.array([0.1, 1.0, 2.0]), np.array([0.3, 1.5, 4.0])
    for scale in (1.0, 1e3, 1e-3):
        gaps = np.abs(np.sort(x) - np.sort(y)) * scale  # uniform weights, equal sizes: matched in order
        top = gaps.max()
        ref = top * np.mean((gaps / top) ** p) ** (1 / p)
        got = float(dg.wasserstein_line(x * scale, y * scale, p=p))
        assert np.isfinite(got) and got == pytest.approx(ref, rel=1e-12)


def _geodesic(u, v, L):
    d = np.mod(u[:, None] - v[None, :], L)
    return np.minimum(d, L - d)


def _assignment_wp(x, y, L, p):
    """Exact W_p on the circle of length L between equal-weight measures of equal size: the
    optimal plan is a permutation (Birkhoff), found by linear_sum_assignment on the geodesic
    cost |·|^p (no quantile function, no cut)."""
    C = _geodesic(x, y, L) ** p
    rows, cols = scipy.optimize.linear_sum_assignment(C)
    return np.mean(C[rows, cols]) ** (1 / p)


@pytest.mark.parametrize("p", [1.5, 3.0, 40.0])
def test_circle_wp_matches_the_assignment(p):
    """W_p on S¹ for p > 1 against the exact assignment: weights k_i/N written as atoms repeated
    k_i times (zero weights and ties included; six atoms a side, so one compilation), several
    periods; then equal weights, n = m = 40."""
    rng = np.random.default_rng(int(10 * p))
    N = 12
    for trial in range(6):
        L = (2 * math.pi, 1.0, 3.7)[trial % 3]
        x, y = rng.uniform(-5, 5, 6), rng.uniform(-5, 5, 6)  # beyond one turn: read modulo L
        if trial % 2:
            x, y = np.round(x), np.round(y)  # ties between and within the measures
        ka, kb = rng.multinomial(N, np.ones(6) / 6), rng.multinomial(N, np.ones(6) / 6)  # zeros likely
        got = float(dg.wasserstein_circle(x, y, ka / N, kb / N, p=p, period=L))
        ref = _assignment_wp(np.repeat(x, ka), np.repeat(y, kb), L, p)
        np.testing.assert_allclose(got, ref, rtol=1e-10)
    x, y = rng.vonmises(0.5, 2.0, 40), rng.uniform(-math.pi, math.pi, 40)
    np.testing.assert_allclose(dg.wasserstein_circle(x, y, p=p), _assignment_wp(x, y, 2 * math.pi, p), rtol=1e-10)


def test_circle_wp_closed_forms_jit_and_vmap():
    # n equally spaced atoms against the same rotated by δ <= half a spacing: each moves δ, for every p
    n = 16
    t = 2 * math.pi * jnp.arange(n) / n
    np.testing.assert_allclose(jax.jit(lambda u, v: dg.wasserstein_circle(u, v, p=2.0))(t, t + 0.1), 0.1, rtol=1e-12)
    # two antipodal atoms against the pair rotated by a quarter turn: W_p = π/2 for every p,
    # and W_2 of a point mass against the uniform law on n atoms: the mean square arc
    two = jnp.array([0.0, math.pi])
    np.testing.assert_allclose(dg.wasserstein_circle(two, two + math.pi / 2, p=2.0), math.pi / 2, rtol=1e-12)
    arcs = np.minimum(np.asarray(t), 2 * math.pi - np.asarray(t))
    np.testing.assert_allclose(dg.wasserstein_circle(t[:1], t, p=2.0), np.sqrt(np.mean(arcs**2)), rtol=1e-12)
    # vmappable over a batch of rotations of a point mass
    shifts = jnp.array([0.0, 0.3, 4.0])
    np.testing.assert_allclose(jax.vmap(lambda s: dg.wasserstein_circle(t[:1], t[:1] + s, p=2.0))(shifts),
                               [0.0, 0.3, 2 * math.pi - 4.0], atol=1e-12)


@pytest.mark.parametrize("p", [700.0, 5000.0])
def test_circle_wp_at_large_p(p):
    """Gaps^p over- or underflow for large p: the slope's sign and the value are taken with the
    largest gap factored out; W_p -> the largest displacement of the best plan as p grows.
    Reference: the assignment on the scaled cost (gap/largest)^p."""
    x, y = np.array([0.1, 1.0, 2.0, 4.0]), np.array([0.3, 1.5, 3.0, 5.9])
    for L in (2 * math.pi, 1e-3 * 2 * math.pi):
        xs, ys = x * L / (2 * math.pi), y * L / (2 * math.pi)
        G = _geodesic(xs, ys, L)
        top = G.max()
        rows, cols = scipy.optimize.linear_sum_assignment((G / top) ** min(p, 700.0))
        gaps = G[rows, cols]
        big = gaps.max()
        ref = big * np.mean((gaps / big) ** p) ** (1 / p)
        got = float(dg.wasserstein_circle(xs, ys, p=p, period=L))
        assert np.isfinite(got) and got == pytest.approx(ref, rel=1e-10)
