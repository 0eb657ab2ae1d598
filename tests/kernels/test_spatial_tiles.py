"""The pieces of ``tp.kernels.SpatialTiles``: the Morton order is a permutation (a plain sort in
one dimension), and the box gap never skips a tile pair holding a pair within the radius, checked
pair by pair against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_pde.kernels.spatial import morton_order, near_tiles, tile_boxes


def test_morton_order_is_a_permutation_and_a_sort_in_one_dimension():
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 5, size=(200, 1))
    order = np.asarray(morton_order(*map(jnp.asarray, (x, x.min(0), x.max(0)))))
    # 2^20 cells on the line: these points fall in distinct cells, so the order is np.argsort's
    np.testing.assert_array_equal(order, np.argsort(x[:, 0], kind="stable"))
    y = rng.normal(size=(300, 4))
    clipped = morton_order(*map(jnp.asarray, (y, y.min(0) + 0.5, y.max(0) - 0.5)))  # points outside the box
    assert sorted(np.asarray(clipped)) == list(range(300))


@pytest.mark.parametrize("p, radius, lattice", [(1, 0.3, False), (2, 0.5, False), (3, 0.8, False), (2, 1.0, True)])
def test_near_tiles_keeps_every_tile_pair_with_a_pair_within_the_radius(p, radius, lattice):
    rng = np.random.default_rng(p)
    if lattice:  # integer points: pairs exactly at the radius 1
        grid = np.stack(np.meshgrid(np.arange(9.0), np.arange(9.0)), -1).reshape(-1, 2)
        q, k = rng.permutation(grid)[:72], rng.permutation(grid)[:72]
    else:
        q, k = rng.uniform(0, 4, size=(72, p)), rng.uniform(0, 4, size=(72, p))
    lo, hi = np.minimum(q.min(0), k.min(0)), np.maximum(q.max(0), k.max(0))
    q, k = (a[np.asarray(morton_order(*map(jnp.asarray, (a, lo, hi))))] for a in (q, k))
    qt, kt = q.reshape(9, 8, p), k.reshape(12, 6, p)
    near = np.asarray(near_tiles(tile_boxes(jnp.asarray(qt), jnp.ones((9, 8), bool)),
                                 tile_boxes(jnp.asarray(kt), jnp.ones((12, 6), bool)), radius))
    d2 = np.sum((q[:, None, :] - k[None, :, :]) ** 2, axis=-1)  # the kernel's squared distances
    within = (d2 <= radius ** 2).reshape(9, 8, 12, 6).any(axis=(1, 3))
    assert np.all(near[within])  # never a skip of a tile pair with a pair inside
    assert not np.all(near)  # and some skipped
    if lattice:
        assert np.any(d2 == radius ** 2)


def test_tile_boxes_ignore_padding():
    pts = np.array([[[0.0, 1.0], [2.0, -1.0], [99.0, 99.0]]])
    lo, hi = tile_boxes(jnp.asarray(pts), jnp.array([[True, True, False]]))
    np.testing.assert_array_equal(lo, [[0.0, -1.0]])
    np.testing.assert_array_equal(hi, [[2.0, 1.0]])


@pytest.mark.parametrize("d", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_spatial_tiles_in_float32_without_x64(d):
    """The default precision (x64 off, float32 tokens): the Morton cells fit float32 and uint32,
    and the skipping layout gives the plain streamed field to float32 round-off."""
    import transformer_pde as tp

    with jax.enable_x64(False):
        x = jax.random.uniform(jax.random.key(0), (300, d), dtype=jnp.float32)
        out = [tp.KrauseAttention.identity(d, sigma=0.1, radius=0.05, layout=lay).velocity(x)
               for lay in (tp.kernels.Streaming(32, 32), tp.kernels.SpatialTiles(tp.kernels.Streaming(32, 32)))]
        assert out[1].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out[1]), np.asarray(out[0]), atol=1e-6)
