"""The spherical sliced Wasserstein distance against a plain NumPy loop over the same great
circles, each circle's W_p by the exact assignment."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

from transformer_pde import diagnostics as dg


def _numpy_ssw(x, y, frames, p):
    """(mean over the frames of W_p^p of the projected measures)^{1/p}: per frame, the angles
    of Uᵀx, and W_p on the circle of length 2π by linear_sum_assignment on the geodesic cost."""
    total = 0.0
    for U in np.asarray(frames):
        s = np.arctan2(x @ U[:, 1], x @ U[:, 0])
        t = np.arctan2(y @ U[:, 1], y @ U[:, 0])
        d = np.mod(s[:, None] - t[None, :], 2 * math.pi)
        C = np.minimum(d, 2 * math.pi - d) ** p
        rows, cols = scipy.optimize.linear_sum_assignment(C)
        total += np.mean(C[rows, cols])
    return (total / len(frames)) ** (1 / p)


def _sphere(rng, n, d, shift=0.0):
    z = rng.normal(size=(n, d))
    z[:, 0] += shift
    return z / np.linalg.norm(z, axis=1, keepdims=True)


@pytest.mark.parametrize("p", [1.0, 2.0])
def test_sliced_sphere_matches_a_numpy_loop(p):
    rng = np.random.default_rng(int(p))
    x, y = _sphere(rng, 7, 3), _sphere(rng, 7, 3, shift=1.5)
    frames = dg.random_great_circles(jax.random.key(1), 12, 3)
    got = float(dg.sliced_wasserstein_sphere(x, y, frames=frames, p=p))
    np.testing.assert_allclose(got, _numpy_ssw(x, y, frames, p), rtol=1e-10)
    # weights k/N as repeated atoms; S^4
    x5, y5 = _sphere(rng, 4, 5), _sphere(rng, 3, 5, shift=1.0)
    ka, kb = np.array([1, 2, 0, 3]), np.array([2, 2, 2])
    f5 = dg.random_great_circles(jax.random.key(2), 5, 5)
    got = float(dg.sliced_wasserstein_sphere(x5, y5, ka / 6, kb / 6, frames=f5, p=p))
    np.testing.assert_allclose(got, _numpy_ssw(np.repeat(x5, ka, 0), np.repeat(y5, kb, 0), f5, p), rtol=1e-10)


def test_random_great_circles_are_orthonormal_and_uniform():
    F = np.asarray(dg.random_great_circles(jax.random.key(0), 4000, 3))
    np.testing.assert_allclose(np.einsum("ldi,ldj->lij", F, F), np.broadcast_to(np.eye(2), (4000, 2, 2)), atol=1e-12)
    # the normal u1 × u2 of a uniform great circle is uniform on S²: its mean is 0 and E[n nᵀ] = I/3
    nrm = np.cross(F[..., 0], F[..., 1])
    assert np.abs(nrm.mean(0)).max() < 4 / math.sqrt(4000)
    assert np.abs(nrm.T @ nrm / 4000 - np.eye(3) / 3).max() < 4 * math.sqrt(2 / 15 / 4000)


def test_sliced_sphere_invariances_and_jit():
    rng = np.random.default_rng(3)
    x, y = _sphere(rng, 9, 3), _sphere(rng, 9, 3, shift=2.0)
    frames = dg.random_great_circles(jax.random.key(4), 6, 3)
    ssw = jax.jit(lambda u, v, f: dg.sliced_wasserstein_sphere(u, v, frames=f))
    # a rotation R of both measures with the frames rotated too changes nothing; μ against μ is 0
    R, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    np.testing.assert_allclose(ssw(x @ R.T, y @ R.T, jnp.einsum("de,lek->ldk", R, frames)), ssw(x, y, frames), rtol=1e-10)
    assert float(ssw(x, x, frames)) == 0.0
    # a point mass against a point mass on a great circle through both: the arc on that slice
    a, b = np.array([[1.0, 0.0, 0.0]]), np.array([[0.0, 1.0, 0.0]])
    U = np.eye(3)[:, :2][None]
    np.testing.assert_allclose(dg.sliced_wasserstein_sphere(a, b, frames=U, p=3.0), math.pi / 2, rtol=1e-12)


def test_sliced_sphere_bad_input():
    x = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    frames = np.eye(3)[:, :2][None]
    with pytest.raises(ValueError, match=r"frames\[0\] must have orthonormal columns"):
        dg.sliced_wasserstein_sphere(x, x, frames=2 * frames)
    with pytest.raises(ValueError, match=r"frames must have shape \(L, d, 2\)"):
        dg.sliced_wasserstein_sphere(x, x, frames=np.eye(3))
    with pytest.raises(ValueError, match="must lie on the unit sphere"):
        dg.sliced_wasserstein_sphere(2 * x, x, frames=frames)
    with pytest.raises(ValueError, match="p must be >= 1"):
        dg.sliced_wasserstein_sphere(x, x, frames=frames, p=0.5)
    with pytest.raises(ValueError, match="num"):
        dg.random_great_circles(jax.random.key(0), 0, 3)
    with pytest.raises(ValueError, match="d"):
        dg.random_great_circles(jax.random.key(0), 3, 1)
