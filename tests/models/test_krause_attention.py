"""Krause (bounded-confidence) attention: a plain NumPy masked softmax on R^d and on the sphere
(radius, top-k, both; causal), the σ → ∞ mean, softmax attention as its sphere limit, and the
Hegselmann–Krause picture: separated groups never interact, a large radius gives consensus."""

import math

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_pde as tp


def _numpy_krause(queries, x, w, Q, K, V, sigma, radius=np.inf, top_k=None, last=None):
    """For each query: keys of positive mass within the radius (and among the top_k nearest,
    ties kept, and j <= last[i] if given), softmax of −|q − k|²/(2σ²) with masses, then
    V(mean − query); no key: zero."""
    out = np.zeros((len(queries), x.shape[1]))
    for i, xq in enumerate(queries):
        d2 = np.array([np.sum((Q @ xq - K @ y) ** 2) for y in x])
        keep = (w > 0) & (d2 <= radius ** 2)
        if last is not None:
            keep &= np.arange(len(x)) <= last[i]
        if top_k is not None and keep.sum() > top_k:
            keep &= d2 <= np.sort(d2[keep])[top_k - 1]
        if not keep.any():
            continue
        e = w[keep] * np.exp(-(d2[keep] - d2[keep].min()) / (2 * sigma ** 2))
        out[i] = V @ (e @ x[keep] / e.sum() - xq)
    return out


@pytest.mark.parametrize("radius, top_k", [(1.2, None), (None, 3), (1.2, 2)])
def test_krause_matches_a_numpy_masked_softmax(radius, top_k):
    rng = np.random.default_rng(0)
    Q, K, V = np.eye(3) + 0.3 * rng.normal(size=(3, 3)), np.eye(3) + 0.3 * rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    x = rng.normal(size=(9, 3))
    w = rng.uniform(0.1, 1, 9)
    w[4] = 0.0  # a zero-mass key is never a neighbour
    w /= w.sum()
    attn = tp.KrauseAttention(Q, K, V, sigma=0.7, radius=radius, top_k=top_k, layout=tp.kernels.Dense())
    r = np.inf if radius is None else radius
    np.testing.assert_allclose(attn.velocity(x, w), _numpy_krause(x, x, w, Q, K, V, 0.7, r, top_k), atol=1e-12)
    queries = rng.normal(size=(5, 3))
    np.testing.assert_allclose(attn.field(queries, x, w), _numpy_krause(queries, x, w, Q, K, V, 0.7, r, top_k), atol=1e-12)
    causal = tp.Causal(attn).velocity(x, w)
    np.testing.assert_allclose(causal, _numpy_krause(x, x, w, Q, K, V, 0.7, r, top_k, last=np.arange(9)), atol=1e-12)


def test_krause_ties_at_the_kth_distance_are_all_kept_and_an_empty_neighbourhood_stays():
    x = np.array([[0.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [3.0, 3.0]])
    attn = tp.KrauseAttention.identity(2, sigma=1.0, top_k=2)
    # token 0: itself, then three keys tied at distance 1: all four kept, their mean is (0, 1/4)
    e = np.array([1.0, 1, 1, 1]) * np.exp(np.array([0.0, -0.5, -0.5, -0.5]))
    np.testing.assert_allclose(attn.velocity(x)[0], e @ x[:4] / e.sum(), atol=1e-14)
    # Q ≠ K: a query farther than the radius from every key does not move
    far = tp.KrauseAttention(np.eye(2), 10 * np.eye(2), np.eye(2), radius=0.5)
    np.testing.assert_array_equal(far.field(np.array([[0.3, 0.3]]), x[1:]), 0.0)


@pytest.mark.parametrize("angle, top_k", [(1.0, None), (None, 3), (1.0, 2)])
def test_krause_on_the_sphere_uses_the_geodesic_neighbourhood(angle, top_k):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(10, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    w = np.full(10, 0.1)
    sphere = tp.Sphere(tp.KrauseAttention.sphere(3, sigma=0.5, angle=angle, top_k=top_k))
    ref = np.zeros_like(x)
    for i, xi in enumerate(x):
        theta = np.arccos(np.clip(x @ xi, -1, 1))
        keep = theta <= (np.inf if angle is None else angle)
        if top_k is not None and keep.sum() > top_k:
            keep &= theta <= np.sort(theta[keep])[top_k - 1]
        e = np.exp((x[keep] @ xi - 1) / 0.5 ** 2)  # −|x − y|²/(2σ²) on the sphere
        m = e @ x[keep] / e.sum()
        ref[i] = m - (m @ xi) * xi
    np.testing.assert_allclose(sphere.velocity(x, w), ref, atol=1e-12)


def test_krause_limits_mean_and_softmax_on_the_sphere():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(6, 3))
    w = rng.uniform(0.1, 1, 6)
    w /= w.sum()
    V = rng.normal(size=(3, 3))
    # σ → ∞, r = ∞: every token moves by V(ȳ − x), ȳ the weighted mean (relative error O(|x|²/σ²))
    wide = tp.KrauseAttention(np.eye(3), np.eye(3), V, sigma=1e7)
    np.testing.assert_allclose(wide.velocity(x, w), (w @ x - x) @ V.T, atol=1e-11)
    # on the sphere, without radius or top-k, it is softmax attention at β = 1/σ²
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    krause = tp.Sphere(tp.KrauseAttention.sphere(3, sigma=0.8))
    soft = tp.Sphere(tp.SoftmaxAttention.identity(3, beta=1 / 0.8 ** 2))
    np.testing.assert_allclose(krause.velocity(u, w), soft.velocity(u, w), atol=1e-13)


def _two_groups():
    """Two groups of four tokens in the plane, each of diameter < 1, 3 apart."""
    rng = np.random.default_rng(3)
    a = rng.uniform(-0.3, 0.3, size=(4, 2))
    b = rng.uniform(-0.3, 0.3, size=(4, 2)) + np.array([3.0, 0.0])
    return a, b


def test_hegselmann_krause_groups_farther_than_the_radius_never_interact():
    a, b = _two_groups()
    x0 = jnp.asarray(np.concatenate([a, b]))
    ts = jnp.array([0.5, 1.0, 3.0])
    save = diffrax.SaveAt(ts=ts)
    # σ → ∞ and every pair of a group within the radius: ẋ_i = m_G − x_i in each group G, so
    # x_i(t) = m_G + (x_i(0) − m_G) e^{−t}, each group's mean conserved and the groups apart
    uniform = tp.KrauseAttention.identity(2, sigma=1e6, radius=1.5)
    xs = np.asarray(tp.solve(uniform, x0, t1=3.0, dt0=0.01, saveat=save).xs)
    for g, sl in ((a, slice(0, 4)), (b, slice(4, 8))):
        m = g.mean(0)
        exact = m + (g - m)[None] * np.exp(-np.asarray(ts))[:, None, None]
        np.testing.assert_allclose(xs[:, sl], exact, atol=1e-8)
        np.testing.assert_allclose(xs[:, sl].mean(1), np.broadcast_to(m, (3, 2)), atol=1e-10)
    # finite σ: the flow of both groups restricted to one is the flow of that group alone
    attn = tp.KrauseAttention.identity(2, sigma=0.3, radius=1.5)
    both = np.asarray(tp.solve(attn, x0, t1=3.0, dt0=0.01, saveat=save).xs)
    alone = np.asarray(tp.solve(attn, jnp.asarray(a), t1=3.0, dt0=0.01, saveat=save).xs)
    np.testing.assert_allclose(both[:, :4], alone, atol=1e-12)


def test_hegselmann_krause_large_radius_gives_consensus():
    """r above the diameter: every pair interacts, the convex hull shrinks to a point (σ = ∞:
    the weighted mean, at rate e^{−t}); r below the gap: two clusters stay 3 apart."""
    a, b = _two_groups()
    x0 = jnp.asarray(np.concatenate([a, b]))
    end = diffrax.SaveAt(t1=True)
    far = np.asarray(tp.solve(tp.KrauseAttention.identity(2, sigma=1.0, radius=10.0), x0, t1=25.0,
                              dt0=0.05, saveat=end).xs[-1])
    assert np.max(np.linalg.norm(far - far.mean(0), axis=1)) < 1e-4
    near = np.asarray(tp.solve(tp.KrauseAttention.identity(2, sigma=1.0, radius=1.5), x0, t1=25.0,
                               dt0=0.05, saveat=end).xs[-1])
    assert np.linalg.norm(near[:4].mean(0) - near[4:].mean(0)) > 2.5
    assert np.max(np.linalg.norm(near[:4] - near[:4].mean(0), axis=1)) < 1e-4


def test_krause_bad_input():
    with pytest.raises(ValueError, match="sigma"):
        tp.KrauseAttention.identity(2, sigma=0.0)
    with pytest.raises(ValueError, match="radius"):
        tp.KrauseAttention.identity(2, radius=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        tp.KrauseAttention.identity(2, top_k=0)
    with pytest.raises(ValueError, match="angle"):
        tp.KrauseAttention.sphere(3, angle=math.pi + 0.1)


def test_krause_gradient_matches_finite_differences_away_from_the_radius():
    """Inside a fixed neighbourhood pattern the field is smooth: autodiff against central
    differences along a random direction (no pair within 0.05 of the radius, the 4th and 5th
    nearest keys 0.05 apart: the pattern holds for steps 1e-6)."""
    import jax

    rng = np.random.default_rng(4)
    x = rng.normal(size=(6, 2))
    d = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
    radius = 1.2
    assert np.all(np.abs(d - radius) > 0.05)
    assert np.all(np.diff(np.sort(d, axis=1)[:, 3:5], axis=1) > 0.05)
    attn = tp.KrauseAttention.identity(2, sigma=0.8, radius=radius, top_k=4)
    u = rng.normal(size=x.shape)
    f = lambda y: jnp.sum(attn.velocity(y) * jnp.asarray(u))  # noqa: E731
    direction = rng.normal(size=x.shape)
    g = float(jnp.sum(jax.grad(f)(jnp.asarray(x)) * direction))
    h = 1e-6
    fd = (float(f(jnp.asarray(x + h * direction))) - float(f(jnp.asarray(x - h * direction)))) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-6)


def _lattice_with_ties(rng, n, d):
    """Integer points (exact squared distances, so many keys tie at the k-th distance) with
    some zero masses."""
    x = rng.integers(-2, 3, size=(n, d)).astype(float)
    w = rng.uniform(0.1, 1, n)
    w[::7] = 0.0
    return x, w / w.sum()


def _spatial(kb, qb):
    return tp.kernels.SpatialTiles(tp.kernels.Streaming(key_block=kb, query_block=qb))


TILED = [tp.kernels.Streaming, _spatial]  # SpatialTiles only with a radius: without one it is its tiles


SLOW = pytest.mark.slow


@pytest.mark.parametrize("radius, top_k, tiled", [(1.5, None, TILED[0]), (None, 4, TILED[0]), (2.0, 3, TILED[0]),
                                                  (None, 1, TILED[0]), pytest.param(1.5, None, TILED[1], marks=SLOW),
                                                  pytest.param(2.0, 3, TILED[1], marks=SLOW)])
def test_streamed_krause_matches_the_dense_kernel_on_rd_ties_included(radius, top_k, tiled):
    rng = np.random.default_rng(7)
    x, w = _lattice_with_ties(rng, 23, 3)
    eye = np.eye(3)
    V = rng.normal(size=(3, 3))
    dense = tp.KrauseAttention(eye, eye, V, sigma=0.8, radius=radius, top_k=top_k, layout=tp.kernels.Dense())
    # tiles of 5 keys (23 = 4·5 + 3: a padded tile) and 4 queries: the k-th distance and its
    # ties fall across tiles
    streamed = tp.KrauseAttention(eye, eye, V, sigma=0.8, radius=radius, top_k=top_k,
                                  layout=tiled(5, 4))
    np.testing.assert_allclose(streamed.velocity(x, w), dense.velocity(x, w), rtol=1e-12, atol=1e-14)
    q = rng.integers(-2, 3, size=(6, 3)).astype(float)
    np.testing.assert_allclose(streamed.field(q, x, w), dense.field(q, x, w), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(tp.Causal(streamed).velocity(x, w), tp.Causal(dense).velocity(x, w),
                               rtol=1e-12, atol=1e-14)
    # and both against the plain NumPy masked softmax
    r = np.inf if radius is None else radius
    np.testing.assert_allclose(streamed.velocity(x, w), _numpy_krause(x, x, w, eye, eye, np.asarray(dense.V), 0.8, r, top_k),
                               atol=1e-12)


@pytest.mark.parametrize("tiled", TILED, ids=["streaming", "spatial"])
def test_streamed_krause_with_general_q_k_and_far_keys_matches_dense(tiled):
    """Q ≠ K, σ small: every kept score underflows without the running maximum; some queries
    have no key within the radius."""
    rng = np.random.default_rng(3)
    Q, K, V = (np.eye(2) + 0.4 * rng.normal(size=(2, 2)) for _ in range(3))
    x = 4 * rng.normal(size=(30, 2))
    for radius, top_k in [(2.0, None), (None, 2), (3.0, 5)]:
        dense = tp.KrauseAttention(Q, K, V, sigma=0.02, radius=radius, top_k=top_k, layout=tp.kernels.Dense())
        streamed = tp.KrauseAttention(Q, K, V, sigma=0.02, radius=radius, top_k=top_k,
                                      layout=tiled(7, 8))
        out = streamed.velocity(x)
        assert np.all(np.isfinite(out))
        np.testing.assert_allclose(out, dense.velocity(x), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("angle, top_k, tiled", [(0.8, None, TILED[0]), (None, 5, TILED[0]), (1.2, 3, TILED[0]),
                                                 pytest.param(0.8, None, TILED[1], marks=SLOW), (1.2, 3, TILED[1])])
def test_streamed_krause_matches_dense_on_the_sphere(angle, top_k, tiled):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(40, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x[10] = x[3]  # a repeated token: exact ties
    x[11] = -x[3]
    dense = tp.Sphere(tp.KrauseAttention.sphere(3, sigma=0.4, angle=angle, top_k=top_k, layout=tp.kernels.Dense()))
    streamed = tp.Sphere(tp.KrauseAttention.sphere(3, sigma=0.4, angle=angle, top_k=top_k,
                                                   layout=tiled(6, 16)))
    np.testing.assert_allclose(streamed.velocity(x), dense.velocity(x), rtol=1e-12, atol=1e-14)


def test_krause_streams_spatial_tiles_by_default_above_512_squared_pairs():
    attn = tp.KrauseAttention.identity(2, radius=0.3)
    assert isinstance(attn.layout, tp.kernels.SpatialTiles)
    assert attn.layout.blocks(512, 512) is None
    assert attn.layout.blocks(1024, 1024) == (128, 128)
    with pytest.raises(ValueError, match="layout"):
        tp.KrauseAttention.identity(2, layout="streaming")


def _data(kind, rng):
    """Uniform, clustered (four tight groups 6 apart, so most tiles are farther than the radius),
    and a shuffled integer lattice (distances exactly at the radius 1 or 2, ties everywhere)."""
    if kind == "uniform":
        return rng.uniform(0, 4, size=(150, 2))
    if kind == "clustered":
        centres = np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0], [6.0, 6.0]])
        return centres[rng.integers(0, 4, 150)] + 0.4 * rng.normal(size=(150, 2))
    grid = np.stack(np.meshgrid(np.arange(12.0), np.arange(12.0)), -1).reshape(-1, 2)
    return rng.permutation(grid)


@pytest.mark.parametrize("kind, radius, top_k", [pytest.param("uniform", 1.0, None, marks=pytest.mark.slow),
                                                 ("clustered", 2.0, 5), ("lattice", 1.0, None),
                                                 pytest.param("lattice", 2.0, 5, marks=pytest.mark.slow)])
def test_spatial_tiles_match_the_dense_kernel_and_skip_far_tiles(kind, radius, top_k):
    """Sorted tiles, only the near ones computed: the dense field to 1e-12 (velocity, causal and
    at other queries), keys exactly at the radius kept, and fewer tile pairs computed than exist."""
    rng = np.random.default_rng(11)
    x = _data(kind, rng)
    w = rng.uniform(0.1, 1, len(x))
    w[::9] = 0.0
    w /= w.sum()
    V = np.eye(2) + 0.3 * rng.normal(size=(2, 2))
    dense, spatial = (tp.KrauseAttention(np.eye(2), np.eye(2), V, sigma=0.7, radius=radius, top_k=top_k, layout=lay)
                      for lay in (tp.kernels.Dense(), _spatial(8, 8)))
    np.testing.assert_allclose(spatial.velocity(x, w), dense.velocity(x, w), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(tp.Causal(spatial).velocity(x, w), tp.Causal(dense).velocity(x, w),
                               rtol=1e-12, atol=1e-14)
    q = x[rng.integers(0, len(x), 20)] + np.where(kind == "lattice", 0.0, 0.1)  # lattice queries: exactly at r
    np.testing.assert_allclose(spatial.field(q, x, w), dense.field(q, x, w), rtol=1e-12, atol=1e-14)
    visits, pairs = spatial.tile_visits(x, x, w)
    assert pairs == (-(-len(x) // 8)) ** 2 and 0 < int(visits) < pairs
    if kind == "lattice":  # and the plain NumPy masked softmax, keys at distance exactly r in
        ref = _numpy_krause(x, x, w, np.eye(2), np.eye(2), V, 0.7, radius, top_k)
        np.testing.assert_allclose(spatial.velocity(x, w), ref, atol=1e-12)


def test_spatial_tiles_compute_only_the_tiles_of_each_cluster():
    """Four clusters of 64 tokens, 10 apart with spread 0.1, radius 0.5, tiles of 16: each
    cluster fills one quadrant, hence 4 consecutive tiles of the Morton order, and each of its
    query tiles computes its 4 key tiles only: 4 · 4 · 4 = 64 of the 16 · 16 tile pairs, counted
    inside the kernel's computed branch. With only top_k nothing can be skipped."""
    rng = np.random.default_rng(12)
    centres = np.repeat(np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]]), 64, axis=0)
    x = rng.permutation(centres + rng.uniform(-0.1, 0.1, size=centres.shape))
    attn = tp.KrauseAttention.identity(2, sigma=0.3, radius=0.5, layout=_spatial(16, 16))
    visits, pairs = attn.tile_visits(x, x)
    assert (int(visits), pairs) == (64, 256)
    dense = tp.KrauseAttention.identity(2, sigma=0.3, radius=0.5, layout=tp.kernels.Dense())
    np.testing.assert_allclose(attn.velocity(x), dense.velocity(x), rtol=1e-12, atol=1e-14)
    top_k_only = tp.KrauseAttention.identity(2, sigma=0.3, top_k=3, layout=_spatial(16, 16))
    assert int(top_k_only.tile_visits(x, x)[0]) == 256
    assert tuple(int(v) for v in dense.tile_visits(x, x)) == (1, 1)


@pytest.mark.parametrize("top_k", [None, 4])
def test_spatial_tiles_on_the_sphere_use_the_chordal_radius(top_k):
    """Tokens on S², a geodesic radius of 0.3: the same field as the dense kernel (repeated and
    antipodal tokens: exact ties), with tiles skipped."""
    rng = np.random.default_rng(13)
    x = rng.normal(size=(256, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x[100:110] = x[:10]
    x[110:120] = -x[:10]
    dense, spatial = (tp.KrauseAttention.sphere(3, sigma=0.4, angle=0.3, top_k=top_k, layout=lay)
                      for lay in (tp.kernels.Dense(), _spatial(8, 8)))
    np.testing.assert_allclose(tp.Sphere(spatial).velocity(x), tp.Sphere(dense).velocity(x), rtol=1e-12, atol=1e-14)
    visits, pairs = spatial.tile_visits(x, x)
    assert int(visits) < pairs // 2


@pytest.mark.slow
def test_spatial_tiles_gradient_matches_dense():
    rng = np.random.default_rng(14)
    x = rng.uniform(0, 3, size=(60, 2))
    u = rng.normal(size=x.shape)
    grads = []
    for lay in (tp.kernels.Dense(), _spatial(8, 8)):
        attn = tp.KrauseAttention.identity(2, sigma=0.8, radius=0.7, top_k=4, layout=lay)
        grads.append(jax.grad(lambda y: jnp.sum(attn.velocity(y) * u))(jnp.asarray(x)))  # noqa: B023
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-10, atol=1e-12)


@pytest.mark.package_errors
def test_spatial_tiles_refuse_a_non_layout():
    with pytest.raises(ValueError, match="SpatialTiles.tiles"):
        tp.kernels.SpatialTiles("streaming")
    with pytest.raises(ValueError, match="SpatialTiles.tiles"):
        tp.kernels.SpatialTiles(tp.kernels.SpatialTiles())
